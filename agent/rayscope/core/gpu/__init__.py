"""Per GPU: which memory figure is trusted, where each booking sits, who holds the memory,
and whether the device needs an operator."""
