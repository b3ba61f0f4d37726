"""Topic views: live, read-only SQL projections of one physical topic, served as virtual topics.

``kanal_topicviews.sql`` compiles a view's ``SELECT ... FROM ... WHERE ...`` statement into one
generated Python function per view (no I/O). The plugin wiring, the virtual topics and the fetch
rewriting live in the other modules of this package.
"""
