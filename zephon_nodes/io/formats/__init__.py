"""What the bytes are: the shard formats (jsonl, jsonl.zst, Parquet, Arrow, tar), recompression."""
