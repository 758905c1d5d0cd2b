"""Who may ask the head: its origin, the page's session, wrong-token buckets, caps on strangers."""
