"""Kernel-IR transforms that match a shape of attention kernels (two GEMMs around an online softmax,
a causal mask, the grid of query tiles × heads): each states what it assumes, and declines with a
schedule note where the program does not have it."""
