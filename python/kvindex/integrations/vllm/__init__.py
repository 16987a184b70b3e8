"""kvindex inside vLLM 0.33: a drop-in ``KVCacheManager`` (:mod:`.manager`).

Importing this package does not import vLLM; :mod:`.manager` does.
"""
