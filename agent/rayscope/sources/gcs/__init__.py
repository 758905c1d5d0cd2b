"""The scheduler's view from Ray's GCS: where its address comes from, the read itself (a
standalone script), the CLI's child process and its early start, and the Ray release adapter."""
