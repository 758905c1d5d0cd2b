"""What the head reads on its own, once per interval: the GCS and Ray's dashboard."""
