"""Shared test setup: GPU tests run only where a GPU is visible; on a CPU,
JAX gets 8 host devices so context parallelism runs in the tests; the
slow tests are marked (SLOW_TESTS) so `pytest -m "not slow" -n 2` is quick.

LCAB_TEST_SHARD=I/N keeps the I-th of N contiguous parts of the collected
tests (0-based), so N processes can share a long GPU suite; contiguous,
so tests that share a reference (tests/conformance.py's AtFullSize) stay
together."""

import os

import pytest
from hypothesis import settings

from lcab.experiments import presets

_HOST_DEVICES = "--xla_force_host_platform_device_count=8"
if not presets.has_gpu() and _HOST_DEVICES not in os.environ.get("XLA_FLAGS", ""):
    # Before any test imports jax: the flag is read when jax starts.
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_HOST_DEVICES}".strip()

# Derandomised: CI sees the same examples on every run.
settings.register_profile("lcab", deadline=None, max_examples=60, derandomize=True)
settings.load_profile("lcab")


# The quick subset, `pytest -m "not slow" -n 2` (pytest-xdist, one worker
# per core of a 2-core machine: 4.4 minutes there, 6-7 on one core), is
# what a developer runs while working; CI runs everything, in one process.
# A test is slow when it takes more than SLOW_SECONDS on a 2-core CPU
# machine (pytest --durations=0 of the whole suite, on a shared host).
# Those below are marked here, by file and test function (every
# parametrisation of it), beside those whose own file says
# @pytest.mark.slow; a new test that slow takes the mark in its file.
SLOW_SECONDS = 3
SLOW_TESTS = {
    "test_advise.py": (
        "test_the_model_is_not_ranked_where_its_nearest_point_is_off",
    ),
    "test_attention_module.py": (
        "test_output_and_gradients_match_a_float64_composition",
        "test_the_output_comes_in_the_compute_dtype_from_float32_parameters",
        "test_the_ring_layer_matches_the_xla_layer_on_packed_documents",
    ),
    "test_comm.py": (
        "test_the_cli_writes_a_row_per_size_and_a_table",
        "test_torch_times_the_same_collectives_under_torchrun",
    ),
    "test_experiments.py": (
        "test_a_killed_run_resumes_where_it_stopped",
        "test_both_frameworks_in_their_own_processes_merge_into_one_table",
        "test_no_flags_on_a_cpu_machine_means_the_cpu_preset",
        "test_the_cp_suite_runs_on_host_devices_without_a_gpu",
    ),
    "test_fullcheck.py": (
        "test_a_wrong_dk_in_the_last_kv_head_fails_backward_only",
        "test_check_can_be_turned_off_and_tables_mark_it",
        "test_each_fault_is_caught_forward",
        "test_each_fault_outside_the_selection_is_caught",
        "test_runner_writes_mismatch_with_the_figures_and_times_the_rest",
        "test_the_faults_hide_from_the_small_probe",
        "test_the_reference_mask_is_the_mask_from_its_slices",
        "test_the_right_backend_passes_with_sampled_rows",
        "test_the_right_kernel_passes_at_4k",
        "test_the_torch_reference_agrees_and_catches_a_fault",
    ),
    "test_golden.py": (
        "test_a_run_that_differs_from_the_golden_results_is_a_mismatch_without_a_time",
        "test_jax_saves_and_torch_compares_on_the_same_inputs_in_its_own_layout",
    ),
    "test_hostile.py": (
        "test_a_fault_only_at_the_timed_size_batch_or_heads_is_a_mismatch",
        "test_a_rerun_that_dies_shows_its_loss_not_the_older_rows",
        "test_a_second_run_into_the_same_folder_is_refused",
        "test_children_die_with_the_command_and_resume_repeats_nothing",
        "test_ctrl_c_stops_cleanly_and_says_how_to_resume",
        "test_every_bad_command_line_fails_at_once_naming_the_flag",
        "test_in_each_framework_a_fault_the_probe_cannot_see_is_a_mismatch",
        "test_sigterm_to_the_command_stops_its_children_too",
    ),
    "test_jax_backends.py": (
        "test_forward_and_backward_are_timed_together_in_turn",
        "test_pallas_triton_matches_the_reference_in_float32_at_its_widest_head_dim",
    ),
    "test_jax_cp.py": (
        "test_a_run_that_differs_from_the_golden_data_is_a_mismatch_without_a_time",
        "test_cp_runs_are_checked_against_a_single_device_run",
        "test_dispatch_chunks_deal_finer_chunks_and_still_match",
        "test_eight_ranks",
        "test_every_strategy_and_dispatch_matches_the_reference",
        "test_rows_carry_cp_size_strategy_and_imbalance",
        "test_the_check_runs_the_timed_program_itself_compiled_once",
        "test_the_double_ring_meets_every_shard_once_and_matches_the_reference",
        "test_the_double_ring_takes_a_ulysses_factor",
        "test_the_ring_runs_every_family_with_the_balanced_dispatch",
        "test_timed_calls_take_inputs_already_dispatched_and_split_over_the_mesh",
        "test_usp_splits_ranks_into_ulysses_groups_and_a_ring",
    ),
    "test_jax_cp_groupcast.py": (
        "test_every_family_matches_the_reference_with_its_own_dispatch",
        "test_shifts_deliver_the_same_keys_with_less_padding",
        "test_the_gathered_transpose_matches_the_reference",
        "test_the_gathers_transpose_sums_each_chunks_slots_as_a_scatter_would",
        "test_the_tabled_kernel_serves_every_rank_at_cp_2_4_and_8",
    ),
    "test_jax_cp_inner.py": (
        "test_every_strategy_and_dispatch_with_the_xla_inner_matches_the_reference",
        "test_rows_of_the_xla_inner_pass_the_gate_and_name_it",
    ),
    "test_model.py": (
        "test_the_cli_prints_the_model_table_and_writes_its_files",
        "test_the_nvlink_flags_override_the_fitted_links",
    ),
    "test_model_calibration.py": (
        "test_the_cli_names_its_rows_and_runs_from_any_directory",
    ),
    "test_module_backend.py": (
        "test_the_cli_times_the_layer_and_counts_its_flops",
        "test_the_dispatched_ring_layer_is_the_natural_layer_in_dispatch_order",
    ),
    "test_pallas_flex_kernels.py": (
        "test_bfloat16_inputs_accumulate_in_float32",
        "test_block_gradients_of_key_parts_sum_to_the_gradients",
        "test_every_family_matches_the_reference_forward_and_backward",
        "test_options_choose_blocks_and_lowering_and_rows_say_so",
        "test_random_masks_lengths_and_groups",
        "test_rows_that_see_nothing_give_zero_and_minus_infinity",
        "test_the_backend_runs_through_the_correctness_gate",
        "test_the_lse_gradient_flows_for_context_parallel_merges",
    ),
    "test_pallas_flex_lowering.py": (
        "test_the_mosaic_backward_lowers_for_a_gpu_on_every_family",
        "test_the_mosaic_forward_lowers_for_a_gpu_on_every_family",
        "test_the_persistent_mosaic_forward_lowers_for_a_gpu_on_every_family",
        "test_the_shared_memory_counts_are_mosaics_own",
    ),
    "test_pallas_flex_tables.py": (
        "test_the_committed_tile_efficiency_table_is_what_the_script_prints",
    ),
    "test_reference_cache.py": (
        "test_a_cp_strategy_on_several_devices_reads_it_too",
        "test_a_second_process_reads_the_reference_and_gets_the_same_errors",
        "test_another_seed_is_another_entry",
    ),
    "test_report.py": (
        "test_cli_prints_the_short_summary_table",
        "test_cli_writes_every_table_figure_and_the_index",
    ),
    "test_report_memory.py": (
        "test_the_cli_writes_the_memory_files_and_indexes_them",
    ),
    "test_runner.py": (
        "test_cpu_backends_match_the_reference_on_every_family",
    ),
    "test_torch_backends.py": (
        "test_block_mask_builds_fast_and_small_at_128k",
        "test_cpu_backends_match_the_reference_on_every_family",
        "test_low_precision_and_batches",
    ),
    "test_torch_cp.py": (
        "test_bfloat16_and_several_sequences_per_batch",
        "test_contiguous_dispatch_and_what_cannot_run",
        "test_inner_kernel_limits_and_rank_count_are_honoured",
        "test_library_strategies_without_their_packages_or_gpu_say_why",
        "test_the_ring_balanced_dispatch_runs_the_ring_and_the_all_gather",
    ),
    "test_trace_overlap.py": (
        "test_profile_dir_writes_a_trace_per_case_and_keeps_the_rows",
    ),
}


def pytest_itemcollected(item):
    """Mark the tests of SLOW_TESTS slow, before -m selects (collection's end)."""
    name = getattr(item, "originalname", item.name)
    if name in SLOW_TESTS.get(item.path.name, ()):
        item.add_marker(pytest.mark.slow)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected theirs
def pytest_collection_modifyitems(config, items):
    shard = os.environ.get("LCAB_TEST_SHARD")
    if shard:
        index, count = (int(part) for part in shard.split("/"))
        begin, end = len(items) * index // count, len(items) * (index + 1) // count
        config.hook.pytest_deselected(items=items[:begin] + items[end:])
        items[:] = items[begin:end]
    if presets.has_gpu():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (no nvidia-smi on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
