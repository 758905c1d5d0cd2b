"""What the head holds: the reports per node and the scheduler view, the usage history, node failures."""
