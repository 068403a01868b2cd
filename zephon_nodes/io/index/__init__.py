"""The dataset index written by ``zephon index``: record counts, offsets and checksums of shards."""
