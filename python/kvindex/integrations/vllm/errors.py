"""The errors the vLLM integration raises: for configurations it does not run, and for
writes to its block objects that would corrupt the index."""

from kvindex.exceptions import InvalidArgumentError, KvIndexError


class UnsupportedVllmConfigError(KvIndexError, ValueError):
    """A vLLM configuration kvindex's ``KVCacheManager`` does not support (hybrid KV cache
    groups, DCP/PCP > 1, encoder-only or cross-attention groups, ...). Raised at
    construction, naming what is unsupported; kvindex never falls back to vLLM's manager."""


class BlockFieldWriteError(KvIndexError, AttributeError):
    """A write to a field of one of kvindex's ``KVCacheBlock`` objects that would corrupt
    the index (a hash, a free-queue link, the block id, a reference count moved other
    than by one held reference): kvindex's Rust pool owns that state, and the block is
    left unchanged. The message names the field, as does ``name`` (an ``AttributeError``
    too, as writing a read-only attribute of vLLM's own block is)."""


class ComputedBlocksTruncationError(InvalidArgumentError, AssertionError):
    """``truncate_computed_blocks`` at a token count a group's block size does not divide,
    or past the blocks a group's hit holds (a Mamba group may hold fewer). The lookup
    result is left unchanged; an ``AssertionError`` too, as vLLM's own check raises."""
