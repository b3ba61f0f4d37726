"""The interceptor pipeline: hookspecs, interceptor model, results and chain resolution."""
