"""Virtual clusters: many tenants on one physical cluster, each seeing only its own names."""
