"""Reading data: shard formats (jsonl, jsonl.zst, Parquet, tar), datasets and the local cache.

``shards`` gives random access to a file's records, ``parquet`` and ``tar`` the other formats,
``cache`` the local cache directory, ``dataset`` cuts shards into work items and ``sources``
opens a recipe dataset's files under its ``on_error`` policy.
"""
