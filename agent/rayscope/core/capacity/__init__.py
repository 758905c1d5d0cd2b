"""Capacity: how one replica is booked, whether R more fit, and why what waits is waiting."""
