"""The out-of-scope tests of vLLM 0.33.0's ``tests/v1/core`` outside the files CI runs
(``run_vllm_suite.py --all-core`` adds them to its ``OUT_OF_SCOPE``): file -> reason -> tests,
a name without ``[...]`` standing for every parametrization of that test function. Each
passed on vLLM's manager and failed with kvindex's ``UnsupportedVllmConfigError`` when this
list was written: every one builds a hybrid KV cache group layout (Mamba, sliding window,
chunked local attention, an MLA target beside a full-attention draft), which hybrid-group
support is to make pass, or decode context parallelism > 1, which is out of scope.
"""

from __future__ import annotations

_HYBRID = "hybrid KV cache groups, not yet supported: "
_MAMBA = _HYBRID + "Mamba / linear-attention state (MambaSpec) beside full attention or MLA"
_SLIDING_WINDOW = _HYBRID + "sliding-window attention (alone, or beside full attention / MLA)"
_CHUNKED_LOCAL = _HYBRID + "chunked local attention"
_MLA_AND_FULL = _HYBRID + "an MLA target group beside a full-attention draft group"
_DCP = "decode context parallelism > 1 (out of scope)"

ALL_CORE_OUT_OF_SCOPE_TESTS: dict[str, dict[str, list[str]]] = {
    "prefix_cache/test_mamba_eagle_resume_checkpoint.py": {
        _MAMBA: [
            "test_a_junction_past_the_prompt_falls_back_and_registers_nothing",
            "test_disabled_by_default",
            "test_enabling_never_reduces_reuse",
            "test_mamba_prefix_cache_drops_hash_block",
            "test_scheduler_never_stops_where_the_manager_refuses",
            "test_sibling_resumes_below_the_block_grid_when_the_prefix_ends_early",
            "test_sibling_resumes_from_the_observed_junction",
        ],
    },
    "prefix_cache/test_partial_prefix_cache_hits.py": {
        _MAMBA: [
            "test_boundary_state_offer_includes_more_mamba_groups_than_two",
            "test_boundary_state_offload_dropped_when_request_freed_before_drain",
            "test_boundary_state_offloads_block_aligned_prompt",
            "test_boundary_state_offloads_returns_cow_target",
            "test_boundary_states_offered_past_prompt_for_resumed_prefill",
            "test_checkpoint_reservation_matches_worker",
            "test_cow_retained_blocks_returned_for_release",
            "test_dcp_fine_hit_retention_uses_hash_alignment",
            "test_dcp_joint_hit_is_bounded_by_replicated_mamba_snapshots",
            "test_dcp_partial_hit_resumes_on_replicated_mamba_snapshot",
            "test_dcp_partial_hit_with_eagle_rewinds_one_hash_unit",
            "test_eagle_block_aligned_checkpoint_replaces_newer_hash",
            "test_eagle_group_registers_unaligned_tail_under_partial_hash_hits",
            "test_external_mamba_hit_same_block_uses_running_cow_on_continue",
            "test_finished_partial_tail_uses_table_source_once",
            "test_hash_aligned_query_end_uses_regular_partial_tail",
            "test_hybrid_full_attention_partial_hash_hit_uses_cow",
            "test_hybrid_mamba_align_partial_hash_hit",
            "test_hybrid_mamba_moved_partial_entry_defers_same_step_hit",
            "test_hybrid_mamba_partial_tail_owner_continue_preserves_later_hit",
            "test_hybrid_mamba_partial_tail_owner_uses_cow_on_continue",
            "test_hybrid_partial_hash_hit_uses_cow_under_dcp",
            "test_hybrid_partial_hash_truncates_full_attention_hit_length",
            "test_hybrid_partial_hit_cow_target_starts_uncached",
            "test_hybrid_partial_hit_with_eagle_stays_within_group_blocks",
            "test_hybrid_sliding_window_group_disables_partial_hash_hits",
            "test_intermediate_chunk_checkpoint_reserved_only_under_dense_retention",
            "test_internal_checkpoint_publication_respects_retention",
            "test_internal_checkpoint_uses_partial_hash_lifecycle",
            "test_kpool_tail_supports_128_token_partial_hash_hits",
            "test_mamba_coarse_checkpoint_retained_below_eagle_proof_boundary",
            "test_mamba_partial_tail_hits_below_eagle_proof_boundary",
            "test_opted_out_scratch_group_keeps_partial_hash_hits",
            "test_partial_hit_then_internal_checkpoint_uses_distinct_mamba_blocks",
            "test_prompt_end_checkpoint_survives_block_aligned_cache_count",
            "test_prompt_end_checkpoint_survives_sparse_retention_with_coarse_hash",
            "test_resolved_cache_hit_alignment_matches_coordinator",
            "test_retention_snapshots_handed_off_with_exact_block_ids",
            "test_snapshot_handoff_dense_default_retention",
            "test_transient_checkpoint_evicts_retained_boundary_hash",
            "test_truncate_computed_blocks_allows_short_mamba_group_only",
            "test_truncate_computed_blocks_preserves_sparse_prefix_positions",
        ],
    },
    "test_contiguous_kv_packing.py": {
        _MAMBA: [
            "TestCSALinearGrouping::test_scratch_group_survives_computed_block_truncation",
        ],
        _SLIDING_WINDOW: [
            "TestCompressorRingGroup::test_ring_beside_paged_groups_keeps_the_kv_block_as_scheduler_block",
            "TestSWABoundedReplayGrouping::test_non_cacheable_swa_leaves_hits_to_the_paged_group",
        ],
    },
    "test_kv_cache_utils.py": {
        _DCP: [
            "test_effective_attention_block_size_matches_events[4]",
        ],
        _MLA_AND_FULL: [
            "test_dcp_target_allocates_replicated_draft_independently[1-False-None]",
            "test_dcp_target_allocates_replicated_draft_independently[1-True-None]",
            "test_dcp_target_allocates_replicated_draft_independently[4-False-None]",
            "test_dcp_target_allocates_replicated_draft_independently[4-True-None]",
        ],
        _SLIDING_WINDOW: [
            "test_dcp_target_allocates_replicated_draft_independently[1-False-256]",
            "test_dcp_target_allocates_replicated_draft_independently[1-True-256]",
            "test_dcp_target_allocates_replicated_draft_independently[4-False-256]",
            "test_dcp_target_allocates_replicated_draft_independently[4-True-256]",
        ],
    },
    "test_mamba_align_chunk_split.py": {
        _MAMBA: [
            "test_fragmented_first_chunk_does_not_poison_mamba_prefix_cache",
            "test_fragmented_tail_chunk_does_not_poison_mamba_prefix_cache",
            "test_intermediate_chunk_ends_stay_block_aligned",
            "test_lookahead_split_caches_partial_tail_boundary",
            "test_poisoning_is_block_size_independent",
        ],
    },
    "test_swa_inflight_window_free.py": {
        _CHUNKED_LOCAL: [
            "test_chunked_local_free_waits_for_in_flight_step",
        ],
        _SLIDING_WINDOW: [
            "test_connector_finish_frees_on_settled_basis",
            "test_swa_free_immediate_when_sync",
            "test_swa_free_waits_for_in_flight_step",
        ],
    },
}
