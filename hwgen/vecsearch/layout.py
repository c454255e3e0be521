"""Host-side packing of an IVF-PQ index into the memory channels of a ChamVS node.

Every IVF list is spread evenly over all ``C`` channels (Chameleon section 4.3): the list's
``i``-th vector (faiss order) goes to channel ``i % C`` at position ``i // C``. Per channel the
image holds two regions, each starting on an AXI word (``W`` bytes, 64 on DDR boards):

**Codes.** For every list, in list order, a *segment* of ``words(l, c) = max(1, ceil(n / cpw))``
words, where ``n`` is the number of the list's vectors on that channel and ``cpw = W / m`` PQ
codes fit in one word. Position ``i`` of the segment is at word ``i // cpw``, bytes
``(i % cpw) * m .. (i % cpw) * m + m - 1`` (code byte ``j`` = sub-space ``j``). Unused code slots
are zero; a list with no vector on a channel still has one (empty) word, so that every PQ unit
sees every list.

**Ids.** For every list, the ``n`` vector ids of its positions on the channel, little-endian,
``id_bytes`` each, packed from a word boundary.

The **address table** has one entry per (list, channel): ``code_word`` (first word of the code
segment), ``count`` (vectors ``n``), ``id_word`` (first word of the ids). It is loaded into the
node with the coarse centroids (``nlist x D``, signed ``elem_bits``) and the PQ centroids
(``m x 256 x D/m``, signed ``elem_bits + 1``).
"""

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

__all__ = ["NodeLayout", "pack_index", "split_lists"]


@dataclass
class NodeLayout:
    """The packed index: memory images and metadata of one node.

    Attributes
    ----------
    images : list of bytes
        Per channel, the memory image (codes region then ids region).
    code_word, count, id_word : (nlist, channels) int64
        The address table.
    word_bytes, codes_per_word, id_bytes : int
    """
    images: list
    code_word: np.ndarray
    count: np.ndarray
    id_word: np.ndarray
    word_bytes: int
    codes_per_word: int
    id_bytes: int

    @property
    def channels(self):
        """Number of memory channels (one image each)."""
        return len(self.images)

    def words(self, lst, channel):
        """Words of the code segment of ``lst`` on ``channel`` (at least one)."""
        return max(1, -(-int(self.count[lst, channel]) // self.codes_per_word))

    def table_entries(self):
        """Address-table entries in the order the node loads them (list major)."""
        return [{"code_word": int(self.code_word[l, c]), "count": int(self.count[l, c]),
                 "id_word": int(self.id_word[l, c])}
                for l in range(self.code_word.shape[0]) for c in range(self.channels)]


def split_lists(list_codes, list_ids, channels):
    """Per list and channel, the (codes, ids) placed there: vector ``i`` to channel ``i % C``."""
    return [[(codes[c::channels], ids[c::channels]) for c in range(channels)]
            for codes, ids in zip(list_codes, list_ids)]


def pack_index(list_codes, list_ids, *, channels, word_bytes, m, id_bytes):
    """Pack per-list PQ codes and ids into ``channels`` memory images (see module docstring)."""
    if word_bytes % m:
        raise ConfigError("m", f"must divide the {word_bytes}-byte memory word", value=m)
    cpw = word_bytes // m
    nlist = len(list_codes)
    placed = split_lists(list_codes, list_ids, channels)
    code_word = np.zeros((nlist, channels), dtype=np.int64)
    count = np.zeros((nlist, channels), dtype=np.int64)
    id_word = np.zeros((nlist, channels), dtype=np.int64)
    images = []
    for c in range(channels):
        code_region, id_region, word = [], [], 0
        for lst in range(nlist):
            codes, _ = placed[lst][c]
            n = len(codes)
            words = max(1, -(-n // cpw))
            seg = np.zeros((words * cpw, m), dtype=np.uint8)
            seg[:n] = codes
            code_word[lst, c], count[lst, c] = word, n
            code_region.append(seg.tobytes())
            word += words
        for lst in range(nlist):
            _, ids = placed[lst][c]
            id_word[lst, c] = word
            raw = np.asarray(ids, dtype=f"<u{id_bytes}").tobytes()
            raw += bytes(-len(raw) % word_bytes)
            id_region.append(raw)
            word += len(raw) // word_bytes
        images.append(b"".join(code_region) + b"".join(id_region))
    return NodeLayout(images, code_word, count, id_word, word_bytes, cpw, id_bytes)

