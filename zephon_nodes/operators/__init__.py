"""Operators: stateless functions run on the worker pool, and accumulators between flushes.

The torchdata nodes that run them in a lane (``OrderedParallelMap``, ``AccumulatorNode``,
``TorchdataStage``) are the engine's: import them from :mod:`zephon_nodes`.
"""

from zephon_nodes.operators.accumulator import Accumulator, LazyAccumulator
from zephon_nodes.operators.batch import collate
from zephon_nodes.operators.chain import Chain
from zephon_nodes.operators.documents import DocBatch, TextBatch
from zephon_nodes.operators.pack import IGNORE_INDEX, ConcatPacker
from zephon_nodes.operators.parse import ParseJsonl
from zephon_nodes.operators.shuffle import ShuffleBuffer
from zephon_nodes.operators.tokenize import (
    ByteTokenizer,
    SentencePieceTokenizer,
    Tokenize,
    Tokenizer,
    load_tokenizer,
)

__all__ = [
    "IGNORE_INDEX",
    "Accumulator",
    "ByteTokenizer",
    "Chain",
    "ConcatPacker",
    "DocBatch",
    "LazyAccumulator",
    "ParseJsonl",
    "SentencePieceTokenizer",
    "ShuffleBuffer",
    "TextBatch",
    "Tokenize",
    "Tokenizer",
    "collate",
    "load_tokenizer",
]
