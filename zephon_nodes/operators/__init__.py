"""Operators: stateless functions run on the worker pool, and accumulators between flushes."""

from zephon_nodes.operators.accumulate import Accumulator, AccumulatorNode
from zephon_nodes.operators.batch import collate
from zephon_nodes.operators.chain import Chain
from zephon_nodes.operators.documents import DocBatch, TextBatch
from zephon_nodes.operators.pack import IGNORE_INDEX, ConcatPacker
from zephon_nodes.operators.parallel_map import OrderedParallelMap
from zephon_nodes.operators.parse import ParseJsonl
from zephon_nodes.operators.shuffle import ShuffleBuffer
from zephon_nodes.operators.stage import TorchdataStage
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
    "AccumulatorNode",
    "ByteTokenizer",
    "Chain",
    "ConcatPacker",
    "DocBatch",
    "OrderedParallelMap",
    "ParseJsonl",
    "SentencePieceTokenizer",
    "ShuffleBuffer",
    "TextBatch",
    "Tokenize",
    "Tokenizer",
    "TorchdataStage",
    "collate",
    "load_tokenizer",
]
