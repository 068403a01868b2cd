"""Multimodal packing: documents with images into ``seq_len`` samples with padded images."""

from __future__ import annotations

import numpy as np

from zephon_nodes.multimodal.tokenize import MMDocBatch, PlacedImage
from zephon_nodes.operators.bestfit import DATASET_IDS, DOCUMENT_IDS
from zephon_nodes.operators.pack import IGNORE_INDEX, Sample
from zephon_nodes.recipe.image import ImageSpec

__all__ = ["IMAGE_FIELDS", "MultimodalPacker"]

PATCHES = "patches"
IMAGE_OFFSETS = "image_offsets"
IMAGE_PATCH_OFFSETS = "image_patch_offsets"
IMAGE_GRIDS = "image_grids"
IMAGE_FIELDS = (PATCHES, IMAGE_OFFSETS, IMAGE_PATCH_OFFSETS, IMAGE_GRIDS)


class _Piece:
    """Pairs ``[start, stop)`` of one document, with the images inside them."""

    __slots__ = ("dataset", "images", "start", "stop", "tokens")

    def __init__(
        self,
        tokens: np.ndarray,
        start: int,
        stop: int,
        images: list[PlacedImage],
        dataset: int,
    ) -> None:
        self.tokens = tokens
        self.start = start
        self.stop = stop
        self.images = images
        self.dataset = dataset


class MultimodalPacker:
    """Accumulator: documents with images -> ``seq_len`` samples, images never cut.

    A document of ``n`` tokens gives ``n - 1`` (input, label) pairs, as in text packing. It
    goes whole into the open sample when its pairs, images and patches fit; otherwise the
    open sample is emitted (padded) and the document starts a new one. A document too large
    for an empty sample fills the open sample's room and continues in the next ones, cut
    between tokens but never inside an image's placeholders (each piece restarts positions).
    At a flush the open sample is emitted, padded. Single-threaded and ordered, so samples
    depend only on the lane's documents.

    Samples hold ``input``, ``labels`` (shifted inside each document; -100 on padding and
    where the label is a placeholder), ``positions``, ``document_ids`` (-1 on padding) and:

    - ``patches``: ``[sample_patches, patch, patch, 3]`` (uint8, or float32 in 0..1 with
      ``image.dtype = "float32"``), the images' patches in order, zero-padded;
    - ``image_offsets``: int64 ``[max_images]``, the input index of each image's first
      placeholder (-1: no image);
    - ``image_patch_offsets``: int64 ``[max_images]``, the index in ``patches`` of each
      image's first patch (-1: no image);
    - ``image_grids``: int64 ``[max_images, 2]``, each image's patch rows and columns (0: no
      image).

    Args:
        seq_len: Tokens per sample.
        pad_id: Input id of padding.
        image: The recipe's image table (patch size, images and patches per sample).
        placeholder_id: Id of the placeholder token.
        provenance: Also emit ``dataset_ids`` (-1 on padding).
    """

    def __init__(
        self,
        seq_len: int,
        pad_id: int,
        image: ImageSpec,
        placeholder_id: int,
        provenance: bool = False,
    ) -> None:
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.patch = image.patch_size
        self.max_images = image.max_images
        self.max_patches = image.patches_per_sample
        self.dtype = np.dtype(image.dtype)
        self.placeholder_id = placeholder_id
        self.provenance = provenance
        self._pieces: list[_Piece] = []
        self._pairs = 0
        self._images = 0
        self._patches = 0

    def _room(self) -> tuple[int, int, int]:
        return (
            self.seq_len - self._pairs,
            self.max_images - self._images,
            self.max_patches - self._patches,
        )

    @staticmethod
    def _cut(
        images: tuple[PlacedImage, ...], start: int, end: int, room: tuple[int, int, int]
    ) -> tuple[int, list[PlacedImage]]:
        """Return the largest stop <= ``end`` that fits ``room`` and cuts no image."""
        stop = min(end, start + room[0])
        taken: list[PlacedImage] = []
        patches = 0
        for img in images:
            if img.start < start:
                continue
            if img.start >= stop:
                break
            size = img.rows * img.cols
            if (
                img.start + img.tokens > stop
                or len(taken) + 1 > room[1]
                or patches + size > room[2]
            ):
                stop = img.start
                break
            taken.append(img)
            patches += size
        return stop, taken

    def feed(self, batch: MMDocBatch) -> list[Sample]:
        """Place the batch's documents; return the samples completed."""
        out: list[Sample] = []
        ends = np.cumsum(batch.lengths)
        empty = (self.seq_len, self.max_images, self.max_patches)
        for d, (end, n) in enumerate(zip(ends.tolist(), batch.lengths.tolist(), strict=True)):
            pairs = n - 1
            if pairs <= 0:
                continue
            tokens = batch.tokens[end - n : end]
            images = batch.images[d]
            start = 0
            while start < pairs:
                stop, taken = self._cut(images, start, pairs, self._room())
                if stop < pairs and self._pieces:
                    whole, _ = self._cut(images, start, pairs, empty)
                    if whole == pairs or stop == start:
                        # The rest fits an empty sample, or nothing fits here: start a new one.
                        out.append(self._emit())
                        continue
                if stop == start:
                    raise ValueError(
                        f"an image of {images[0].tokens} tokens does not fit an empty sample "
                        f"(seq_len={self.seq_len}, max_images={self.max_images}, "
                        f"sample_patches={self.max_patches})"
                    )
                self._pieces.append(_Piece(tokens, start, stop, taken, batch.dataset))
                self._pairs += stop - start
                self._images += len(taken)
                self._patches += sum(i.rows * i.cols for i in taken)
                start = stop
                if stop < pairs or self._pairs == self.seq_len:
                    out.append(self._emit())
        return out

    def flush(self) -> list[Sample]:
        """Emit the open sample, padded (nothing if it is empty)."""
        return [self._emit()] if self._pieces else []

    def _emit(self) -> Sample:
        s, p = self.seq_len, self.patch
        inp = np.full(s, self.pad_id, dtype=np.int64)
        lab = np.full(s, IGNORE_INDEX, dtype=np.int64)
        pos = np.zeros(s, dtype=np.int64)
        doc = np.full(s, -1, dtype=np.int64)
        ds = np.full(s, -1, dtype=np.int64)
        patches = np.zeros((self.max_patches, p, p, 3), dtype=self.dtype)
        offsets = np.full(self.max_images, -1, dtype=np.int64)
        patch_offsets = np.full(self.max_images, -1, dtype=np.int64)
        grids = np.zeros((self.max_images, 2), dtype=np.int64)
        at = k = q = 0
        for j, piece in enumerate(self._pieces):
            m = piece.stop - piece.start
            t = piece.tokens
            inp[at : at + m] = t[piece.start : piece.stop]
            lab[at : at + m] = t[piece.start + 1 : piece.stop + 1]
            pos[at : at + m] = np.arange(m)
            doc[at : at + m] = j
            ds[at : at + m] = piece.dataset
            for img in piece.images:
                size = img.rows * img.cols
                offsets[k] = at + img.start - piece.start
                patch_offsets[k] = q
                grids[k] = (img.rows, img.cols)
                patches[q : q + size] = img.patches
                k += 1
                q += size
            at += m
        lab[lab == self.placeholder_id] = IGNORE_INDEX
        self._pieces, self._pairs, self._images, self._patches = [], 0, 0, 0
        sample: Sample = {
            "input": inp,
            "labels": lab,
            "positions": pos,
            DOCUMENT_IDS: doc,
            PATCHES: patches,
            IMAGE_OFFSETS: offsets,
            IMAGE_PATCH_OFFSETS: patch_offsets,
            IMAGE_GRIDS: grids,
        }
        if self.provenance:
            sample[DATASET_IDS] = ds
        return sample
