"""The error the vLLM integration raises for configurations it does not run."""

from kvindex.exceptions import KvIndexError


class UnsupportedVllmConfigError(KvIndexError, ValueError):
    """A vLLM configuration kvindex's ``KVCacheManager`` does not support (hybrid KV cache
    groups, DCP/PCP > 1, encoder-only or cross-attention groups, ...). Raised at
    construction, naming what is unsupported; kvindex never falls back to vLLM's manager."""
