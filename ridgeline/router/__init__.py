"""A router in front of Ridgeline replicas: OpenAI routes proxied, load- and cache-aware choice of
replica from the replicas' KV events. See README "Replicas and routing"."""
