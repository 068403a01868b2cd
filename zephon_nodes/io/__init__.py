"""Reading data: where bytes live, what they are, and the shard formats.

Start here to learn how data is read:

- ``storage``: paths and URIs (``s3://``, ``gs://``, ``az://``, ``hf://``, ``http(s)://``),
  globs, range reads and retries of transient errors;
- ``checksum`` and ``identity``: a shard's identity is its content checksum (what joins the
  recipe fingerprint), never its path;
- ``index``: the dataset index written by ``zephon index`` (start-up without reading shards);
  ``remote``: remote shards fetched and indexed once without one; ``recompress``: shards
  rewritten as multi-frame ``.zst``;
- ``shards`` gives random access to a jsonl file's records, ``parquet`` and ``tar`` the other
  formats, ``cache`` the local cache directory, ``dataset`` cuts shards into work items and
  ``sources`` opens a recipe dataset's files under its ``on_error`` policy;
- ``nodecache``, ``future`` and ``wholeshard``: the bounded node cache shared by a node's
  ranks, fed with the exact future accesses.
"""
