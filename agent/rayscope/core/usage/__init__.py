"""The usage window (per actor and device, the peak per slot) and its summary."""
