"""The bounded node cache shared by a node's ranks, fed with the exact future accesses."""
