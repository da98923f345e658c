"""Every factual claim of the README, and the test that fails if it stops being true.

One entry per claim, `- claim` then `  → test` for each test that pins it, under a `§ ` line per
README section (`#` to `###` headings, spelled as in the README). A test is `tests/<file>.py::<name>`; a parametrised test
is named without its ids. `test_every_named_test_exists` fails when a named test is renamed or
removed, `test_every_readme_section_lists_its_claims` when the README gains a section this list does
not have. To add a claim: add its line under its section, naming the test that pins it.

Measurements (seconds, sizes, load averages, nats) are not pinned: they depend on the machine and
its load, say so where they appear, and the `bench/` scripts or the named slow tests reproduce the
runs they come from. Claims not pinned yet are listed at the end of their section as `unpinned:`.

§ tapdeck
- captures prompt ids, sampled ids and logprobs from four dialects, streaming synthesised
  → tests/proxy/dialects/test_sdk_end_to_end.py::test_anthropic_sdk_three_turn_tool_conversation_is_one_root
  → tests/proxy/dialects/test_sdk_end_to_end.py::test_openai_responses_sdk_three_turn_tool_conversation_is_one_root
  → tests/proxy/dialects/test_sdk_end_to_end.py::test_google_genai_sdk_three_turn_tool_conversation_is_one_root
  → tests/proxy/capture/test_openai_sdk_capture.py::test_openai_sdk_stream_matches_capture_and_turn_is_durable_first
- calls link into a rollout graph by exact token prefix; every prefix break is visible
  → tests/proxy/capture/test_graph.py::test_greedy_conversation_links_by_exact_prefix
  → tests/proxy/capture/test_graph.py::test_retokenized_reply_links_with_warn_naming_node_and_offset
- the TUI is usable at 80×24
  → tests/app/test_snapshots.py::test_screen_snapshot
  → tests/app/test_tmux.py::test_tapdeck_runs_a_rollout_by_keystrokes_and_quits_freeing_the_port

§ Two commands
- set-up prints a line per step, pip's output goes to `.venv/setup.log`, a failed step prints the
  log's tail and what to do, a long step reports its elapsed time
  → tests/test_setup_script.py::test_a_first_set_up_prints_a_handful_of_lines_and_keeps_pips_output_in_the_log
  → tests/test_setup_script.py::test_a_failed_step_shows_the_logs_tail_and_what_to_do
  → tests/test_setup_script.py::test_a_long_step_reports_the_elapsed_and_the_expected_time_until_it_ends
- later runs start at once
  → tests/test_setup_script.py::test_setup_on_the_venv_it_set_up_prints_nothing
- the defaults need no flag, key or network (sample dataset, host sandbox, embedded engine,
  terminus-2) and `tapdeck rollout` with no flags ends graded by its turn budget
  → tests/app/commands/test_newcomer_path.py::test_default_rollout_is_graded_and_ends_by_its_turn_budget
- the small model never solves a task (reward 0)
  → tests/app/commands/test_newcomer_path.py::test_default_rollout_is_graded_and_ends_by_its_turn_budget
  → tests/runner/test_terminus2.py::test_terminus2_rollout_is_graded_captured_on_every_turn_and_reconciled
- `--engine` takes `HOST:PORT`, `http://HOST:PORT` and `…/v1`
  → tests/proxy/upstream/test_engine_address.py::test_every_address_form_settles_on_the_recorded_engines_v1_base_url
- a `TAPDECK_PYTHON` that is not 3.12 or newer is refused
  → tests/test_setup_script.py::test_a_tapdeck_python_that_is_not_a_312_is_refused_not_ignored
- unpinned: finding a Python (PATH, pyenv, `TAPDECK_PYTHON`) and saying what to install when none is found

§ Layout
- the folders map to the import package `tapdeck`; an editable install and a wheel both import
  → tests/test_packaging.py::test_wheel_installs_everything_under_the_tapdeck_package
  → tests/test_packaging.py::test_wheel_imports_in_a_fresh_target
  → tests/test_layering.py::test_package_is_namespaced_under_tapdeck
- the layering rule
  → tests/test_layering.py::test_layer_imports_nothing_above_it
  → tests/app/test_views.py::test_core_modules_do_not_import_textual

§ Command line
- the command table names exactly the CLI's commands
  → tests/test_readme_claims.py::test_the_command_table_names_every_command_the_cli_has
- a run's table counts cancelled rollouts apart from failed ones; one never started is `-`, not `…`
  → tests/app/commands/test_runs_command.py::test_runs_of_a_cancelled_run_counts_the_cancel_apart_and_the_unrun_rollout_as_not_ok
- exit codes 0/1/2, and `tapdeck rollout`'s 3, listed in its `--help`
  → tests/app/commands/test_rollout_exit_codes.py::test_rollout_help_states_every_exit_code
  → tests/app/commands/test_rollout_exit_codes.py::test_an_unknown_option_exits_2
  → tests/app/commands/test_rollout_exit_codes.py::test_no_engine_answering_exits_1
  → tests/app/commands/test_rollout_exit_codes.py::test_a_plan_the_server_refuses_exits_2
  → tests/app/commands/test_rollout_exit_codes.py::test_a_failed_rollout_exits_3_and_the_table_says_why
- `tapdeck rollout`: refused plans (sandbox, `--engine-model`, non-finite numbers, sizes past their
  bounds, plan options with `--resume`, engine options resuming a run that calls no model) are 2
  before a run exists; a missing run, a corrupt plan.json, a run no rollout reached the engine of, and
  a server that stopped answering are 1; `--server` takes HOST:PORT; `--resume` follows a running run;
  server log lines go to `rollout.log`; `calls` is the model calls
  → tests/app/commands/test_rollout_exit_codes.py::test_an_unknown_sandbox_exits_2_before_a_run_is_created
  → tests/app/commands/test_rollout_exit_codes.py::test_a_number_that_is_not_finite_exits_2
  → tests/app/commands/test_rollout_exit_codes.py::test_resume_refuses_plan_options_naming_them
  → tests/app/commands/test_rollout_exit_codes.py::test_resume_of_a_run_that_calls_no_model_refuses_engine_options_naming_them
  → tests/app/commands/test_rollout_exit_codes.py::test_resuming_a_run_that_does_not_exist_exits_1
  → tests/app/commands/test_rollout_exit_codes.py::test_a_size_past_its_bound_exits_2_naming_the_field
  → tests/app/commands/test_rollout_exit_codes.py::test_resuming_a_run_whose_plan_file_is_corrupt_exits_1_naming_the_file
  → tests/app/commands/test_rollout_exit_codes.py::test_resume_refuses_a_run_id_that_is_not_a_plain_name
- `tapdeck rollout`: `-n` with `--task` is 2; a dataset name the registry does not know is 2 and
  a registry that does not answer is 1, each said as such; resuming a run whose rollouts all ran to
  their end says so, starts nothing and exits 0
  → tests/app/commands/test_rollout_edge_inputs.py::test_rollout_refuses_n_with_a_single_task_or_several
  → tests/app/commands/test_rollout_edge_inputs.py::test_rollout_says_a_dataset_name_its_registry_does_not_know_is_unknown
  → tests/app/commands/test_rollout_edge_inputs.py::test_rollout_says_a_registry_that_does_not_answer_is_unreachable_and_exits_1
  → tests/app/commands/test_rollout_edge_inputs.py::test_resuming_a_complete_run_says_so_and_starts_nothing
  → tests/app/commands/test_rollout_edge_inputs.py::test_resuming_a_complete_run_on_a_server_says_so_and_leaves_it_untouched
- `tapdeck info` warns naming each task.toml a dataset leaves out; a `--dataset` that names none is
  2, one whose source does not answer is 1
  → tests/app/test_cli_failures.py::test_info_lists_the_good_tasks_and_warns_naming_each_task_toml_it_cannot_parse
  → tests/app/test_cli_failures.py::test_info_refuses_a_dataset_path_that_does_not_exist_naming_it
  → tests/app/test_cli_failures.py::test_info_refuses_a_dataset_name_its_registry_does_not_know
  → tests/app/test_cli_failures.py::test_info_says_a_registry_that_does_not_answer_is_unreachable_and_exits_1
- a git dataset whose host does not answer is unreachable, and one whose host has no such
  repository is unknown, each in git's own words
  → tests/runner/test_datasets.py::test_a_git_host_that_does_not_answer_is_unreachable_in_gits_own_words
  → tests/runner/test_datasets.py::test_a_git_host_without_the_repository_makes_it_an_unknown_dataset
- `tapdeck rollout` and Setup's start warn naming each task folder the run leaves out, the run keeps
  them (`left_out`, counted on Runs), and `--task` naming one is refused saying what is wrong
  → tests/app/commands/test_rollout_edge_inputs.py::test_rollout_of_a_dataset_with_a_broken_task_warns_naming_it_and_runs_the_rest
  → tests/app/commands/test_rollout_edge_inputs.py::test_rollout_refuses_a_named_task_whose_task_toml_harbor_cannot_read_saying_why
  → tests/app/test_failed_actions.py::test_setup_start_warns_naming_each_task_folder_the_run_leaves_out
  → tests/app/test_views.py::test_the_failures_line_counts_the_task_folders_a_run_left_out
- `tapdeck runs` lists the runs or shows one run's rollouts from the run files, writing nothing
  → tests/app/commands/test_runs_command.py::test_runs_lists_each_run_newest_first_with_its_state_and_outcome
  → tests/app/commands/test_runs_command.py::test_runs_of_one_run_prints_its_rollouts_and_why_they_failed
  → tests/app/commands/test_runs_command.py::test_runs_shows_a_run_another_process_runs_as_running
  → tests/app/commands/test_runs_command.py::test_runs_says_what_is_wrong_with_a_run_it_cannot_show
  → tests/app/commands/test_runs_command.py::test_runs_in_a_data_dir_without_runs_says_how_to_start_one
- `tapdeck sessions` lists the sessions, or shows one session's graph or one turn's tokens, from
  the store read-only, as the server's admin API answers
  → tests/app/commands/test_sessions_command.py::test_sessions_lists_each_session_newest_first_with_its_graph_counts_and_reward
  → tests/app/commands/test_sessions_command.py::test_sessions_json_list_is_what_the_server_answers_for_its_store
  → tests/app/commands/test_sessions_command.py::test_sessions_json_says_how_long_since_each_sessions_last_call_as_the_server_does
  → tests/app/commands/test_sessions_command.py::test_a_sessions_graph_nests_its_fork_and_shows_the_demoted_and_discarded_calls
  → tests/app/commands/test_sessions_command.py::test_a_sessions_json_is_its_rollout_document_as_the_server_answers
  → tests/app/commands/test_sessions_command.py::test_a_turns_tokens_come_one_a_line_with_the_engines_ids_and_logprobs
  → tests/app/commands/test_sessions_command.py::test_sessions_names_what_is_missing_and_refuses_bad_usage
  → tests/app/commands/test_sessions_command.py::test_sessions_run_naming_no_run_exits_1_saying_so
- a run another process on the data dir runs shows as running, and is neither resumed nor
  cancelled from here, naming that process
  → tests/runner/test_run_lock.py::test_a_second_server_on_the_data_dir_sees_the_run_running_and_neither_resumes_nor_cancels_it
  → tests/runner/test_run_lock.py::test_resuming_a_run_another_process_runs_says_which_and_starts_nothing
  → tests/runner/test_run_lock.py::test_the_lock_names_the_process_that_holds_it_and_dies_with_it
- Ctrl-C or SIGTERM while `tapdeck rollout` follows a run cancels it and prints the table
  → tests/app/commands/test_rollout_follow.py::test_sigterm_cancels_a_followed_run_as_ctrl_c_does
  → tests/app/commands/test_rollout_exit_codes.py::test_a_dead_engine_behind_a_server_exits_1_as_a_local_one_does
  → tests/app/commands/test_rollout_exit_codes.py::test_server_given_as_host_port_is_accepted_and_a_short_dataset_is_said
  → tests/app/commands/test_rollout_exit_codes.py::test_no_admin_key_found_says_where_it_looked
  → tests/app/commands/test_engine_model_refused.py::test_rollout_refuses_an_engine_model_the_engine_does_not_serve
  → tests/app/commands/test_engine_model_refused.py::test_a_server_refuses_a_plan_naming_a_model_its_engine_does_not_serve
  → tests/app/commands/test_engine_model_refused.py::test_serve_refuses_an_engine_model_the_engine_does_not_serve
  → tests/app/commands/test_rollout_follow.py::test_rollout_follow_gives_up_when_the_server_goes_away
  → tests/app/commands/test_rollout_follow.py::test_resume_of_a_run_still_going_follows_it
  → tests/app/commands/test_rollout_command.py::test_rollout_keeps_server_logs_off_stderr_and_summary_lines_whole_in_a_file
  → tests/app/commands/test_rollout_command.py::test_rollout_log_records_every_answered_call
- the table's error column is followed by a line per distinct error, after its tasks
  → tests/app/commands/test_rollout_table_says_why.py::test_the_table_is_followed_by_each_failed_rollouts_reason_naming_its_task
  → tests/app/commands/test_rollout_table_says_why.py::test_one_error_of_several_tasks_is_said_once_naming_them
- a run with a result line this version cannot read is not resumed; other bad lines are warned
  about; a torn last line is ignored
  → tests/runner/test_results_file_bad_lines.py::test_a_run_with_a_result_this_version_cannot_read_is_not_resumed_until_it_is_removed
  → tests/runner/test_results_file_bad_lines.py::test_every_other_bad_line_is_named_in_a_warning_and_the_good_ones_load
  → tests/runner/test_results_file_bad_lines.py::test_a_torn_last_line_is_ignored_without_a_warning
- `serve` refuses a port in use and a bind beyond loopback without `--admin-key`
  → tests/app/test_host.py::test_serve_cli_refuses_public_bind_and_names_a_held_port
- data lives in `--data-dir`, else `$TAPDECK_DATA_DIR`; `admin.key` is 0600; the listing names
  every file a server leaves there (`admin.key.lock` included)
  → tests/proxy/test_config_and_keys.py::test_data_dir_defaults_to_env
  → tests/proxy/test_config_and_keys.py::test_admin_key_file_is_owner_only
  → tests/test_readme_claims.py::test_the_data_dir_listing_names_every_file_a_server_leaves_there
- bad usage is 2 and a failure of the world 1, each one line: ports out of range, addresses that
  are not http(s) URLs, a `--host` that does not resolve, a data dir that is a file or cannot be
  made, a server that does not answer or refuses the key, a path that cannot be written
  → tests/app/test_cli_failures.py::test_a_port_out_of_range_is_bad_usage
  → tests/app/test_cli_failures.py::test_a_host_that_does_not_resolve_is_named_not_blamed_on_the_port
  → tests/app/test_cli_failures.py::test_a_command_refuses_a_data_dir_that_is_a_file
  → tests/app/test_cli_failures.py::test_serve_says_which_data_dir_it_cannot_create
  → tests/app/test_cli_failures.py::test_engine_refuses_a_port_in_use_and_a_model_that_is_not_a_file_as_bad_usage
  → tests/app/test_cli_failures.py::test_engine_refuses_a_model_file_that_is_not_a_gguf_as_bad_usage
  → tests/app/test_cli_failures.py::test_info_refuses_an_engine_address_that_is_not_one
  → tests/app/test_cli_failures.py::test_train_against_a_server_that_does_not_answer_could_not_do_its_work
  → tests/app/test_cli_failures.py::test_train_refuses_a_server_address_that_is_not_a_url
  → tests/app/test_cli_failures.py::test_export_says_which_out_path_it_cannot_write
  → tests/app/test_cli_failures.py::test_a_client_refuses_an_admin_key_no_request_can_carry_as_bad_usage
  → tests/app/test_cli_failures.py::test_an_admin_key_file_that_is_not_utf8_text_is_named
  → tests/app/test_cli_failures.py::test_a_server_that_is_not_tapdeck_is_said_in_one_line_not_dumped
  → tests/app/commands/test_attach.py::test_attach_to_an_address_that_is_not_a_server_url_is_bad_usage
  → tests/app/commands/test_attach.py::test_attach_with_a_wrong_admin_key_exits_with_one_line_naming_the_key
  → tests/app/commands/test_train_cli.py::test_train_with_an_unknown_recipe_is_bad_usage
- `tapdeck engine --n-ctx` is 256 to 4× the model's trained context, served as given, refused
  outside it before the weights load; `--threads` is at least 1
  → tests/app/test_cli_failures.py::test_engine_refuses_a_context_length_it_does_not_serve_as_bad_usage
  → tests/runner/engine/test_context_length.py::test_a_context_outside_the_range_is_refused_before_the_weights_load
  → tests/runner/engine/test_context_length.py::test_a_context_between_llama_cpps_blocks_is_served_as_asked_not_rounded_up
  → tests/app/test_cli_failures.py::test_engine_refuses_a_thread_count_below_one_as_bad_usage
- `export` reads the store read-only: another program's database is refused (1) and left unchanged
  → tests/app/commands/test_export.py::test_export_refuses_a_database_that_is_not_a_store_and_leaves_it_byte_for_byte
- a run's export leaves out rollouts that did not end ok unless `--include-failed`, and marks each
  row with `ok` and `error_kind`; its format follows `--out`'s suffix; unreadable results are 1
  → tests/app/commands/test_export.py::test_export_leaves_out_rollouts_that_did_not_end_ok_unless_asked
  → tests/app/commands/test_export.py::test_export_writes_the_format_its_out_suffix_names
  → tests/app/commands/test_export.py::test_export_refuses_an_out_path_its_format_cannot_go_to
  → tests/app/commands/test_export.py::test_export_of_a_run_whose_results_cannot_be_read_says_why
  → tests/app/commands/test_export.py::test_export_from_a_corrupt_capture_db_says_so
  → tests/app/commands/test_export.py::test_export_refuses_a_run_whose_sessions_are_not_in_the_store
  → tests/app/commands/test_export.py::test_export_refuses_a_target_that_is_not_a_plain_id
- unpinned: the data dir also holds `exports/` (export's default `--out`), `rollout.log`, and the
  TUI's `tui.log` and `tui.json`

§ The server API
- every admin route of the table exists on the server
  → tests/test_readme_claims.py::test_every_admin_route_of_the_table_exists_on_the_server
- a run's export refuses (409, naming the rollout and its session) a run whose rollouts name
  sessions the store does not have, with `tapdeck export`'s message
  → tests/app/commands/test_export.py::test_the_servers_run_export_refuses_a_run_with_sessions_missing_as_the_cli_does
- admin routes need the admin key; `/health` leaks nothing
  → tests/proxy/http/test_auth_and_failures.py::test_admin_routes_need_the_admin_key
  → tests/proxy/http/test_auth_and_failures.py::test_health_leaks_nothing
- an admin key no HTTP header can carry is refused by `serve` and by clients
  → tests/app/test_cli_failures.py::test_serve_refuses_an_admin_key_no_client_could_send
  → tests/proxy/test_config_and_keys.py::test_an_admin_key_no_client_can_send_is_refused_on_any_bind
- a generated key is written to `admin.key` unless another server still runs on the data dir
  → tests/app/test_host.py::test_generated_admin_key_written_and_explicit_key_used
  → tests/app/test_host.py::test_a_second_server_on_a_data_dir_leaves_the_running_ones_admin_key_file
  → tests/app/test_host.py::test_serve_beside_a_running_server_does_not_claim_its_key_is_in_the_file
- a server restarted on a data dir keeps the key `admin.key` holds (a strong one), so clients reconnect
  → tests/app/test_host.py::test_a_restarted_server_keeps_the_admin_key_its_predecessor_wrote
  → tests/app/test_tui_multi_client.py::test_an_attached_tui_reconnects_to_a_server_restarted_on_its_data_dir
- a session names the base URL it settled on and records the engine's context (`max_model_len`)
  → tests/proxy/upstream/test_engine_address.py::test_session_bodies_take_every_address_form_and_say_where_they_settled
  → tests/runner/test_rollout_settings.py::test_settings_that_do_not_fit_fail_the_rollout_before_the_trial
- model routes take the session key from every provider location; unknown keys are 401 in the
  caller's envelope
  → tests/proxy/test_config_and_keys.py::test_key_is_read_from_every_provider_location
  → tests/proxy/http/test_auth_and_failures.py::test_unknown_session_key_is_401_in_openai_shape
  → tests/proxy/http/test_routing.py::test_unknown_key_on_google_route_is_401_in_google_shape
  → tests/proxy/http/test_auth_and_failures.py::test_a_model_listing_with_a_bad_key_answers_in_the_sdks_own_error_shape
- admin errors are `{detail, kind, retryable}`
  → tests/proxy/http/test_auth_and_failures.py::test_every_admin_refusal_has_detail_kind_and_retryable
- paths are matched case-insensitively
  → tests/proxy/dialects/test_chat_dialect.py::test_registry_detects_every_dialect_case_insensitively
- the event stream carries session, turn and run events
  → tests/proxy/http/test_auth_and_failures.py::test_admin_events_stream_session_and_turn_events

§ What capture guarantees
- upstream calls are unstreamed with capture fields forced on; alternatives asked for inspection
  → tests/proxy/upstream/test_prepare.py::test_stream_request_goes_upstream_unstreamed_without_stream_options
  → tests/proxy/upstream/test_prepare.py::test_tokens_tier_forces_capture_fields
  → tests/proxy/upstream/test_prepare.py::test_calls_ask_the_engine_for_at_least_the_probed_alternatives
- empty tools are dropped, `model` is rewritten, truncating knobs are neutralised at the training
  tier with the request kept
  → tests/proxy/upstream/test_prepare.py::test_empty_tools_dropped_with_orphaned_tool_choice
  → tests/proxy/upstream/test_prepare.py::test_model_rewritten_to_served_name
  → tests/proxy/upstream/test_prepare.py::test_training_tier_resets_truncating_knobs_and_keeps_requested
- a temperature the harness left out is sent as 1.0 at the training tier; greedy training turns are a WARN
  → tests/proxy/upstream/test_prepare.py::test_training_tier_sends_temperature_one_when_neither_harness_nor_policy_sets_it
  → tests/proxy/dialects/test_agent_quirks.py::test_a_training_turn_sampled_greedily_is_a_finding
- engines are probed once into a tier; unknown is `text`; raw logprobs are told from processed
  → tests/proxy/upstream/test_tiers.py::test_probe_full_vllm_is_tokens_tier_with_served_name
  → tests/proxy/upstream/test_tiers.py::test_probe_neither_is_text_tier
  → tests/proxy/upstream/test_tiers.py::test_probe_raw_logprobs_demotes_with_fatal
  → tests/proxy/upstream/test_tiers.py::test_concurrent_first_probes_share_one
- a call that finds the engine refusing connections drops its cached probe
  → tests/proxy/http/test_auth_and_failures.py::test_an_engine_found_down_is_probed_again_by_the_next_session
- every turn is committed before the reply; `kill -9` loses no replied turn; a restarted server
  lists and exports old sessions
  → tests/proxy/store/test_crash_recovery.py::test_kill_9_mid_rollout_loses_no_replied_turn
  → tests/app/test_host.py::test_restarted_server_lists_old_sessions_as_interrupted_and_exports_them
- a turn stores only what it adds; each distinct message once
  → tests/proxy/store/test_store.py::test_prompts_are_stored_as_deltas
  → tests/proxy/store/test_store.py::test_each_distinct_message_is_stored_once
- linking by hash index, only new tokens hashed, arrival order irrelevant
  → tests/proxy/capture/test_graph.py::test_linking_reads_no_stored_node_tokens
  → tests/proxy/capture/test_graph.py::test_linking_an_extending_call_hashes_only_its_new_tokens
  → tests/proxy/capture/test_graph.py::test_arrival_order_never_changes_the_graph
- the three recorded vLLM prefix breaks are visible
  → tests/proxy/capture/test_graph.py::test_truncated_turn_links_as_prefix_with_info_about_the_unsampled_end_token
  → tests/proxy/capture/test_graph.py::test_retokenized_reply_links_with_warn_naming_node_and_offset
  → tests/proxy/capture/test_graph.py::test_special_tokens_inside_reply_are_visible_breaks
  → tests/proxy/dialects/test_wire_fidelity.py::test_a_reply_cut_at_a_stop_string_names_the_stop_string_as_the_prefix_break
- `previous_response_id` chains link; an unknown id is a 400
  → tests/proxy/dialects/test_sdk_end_to_end.py::test_openai_responses_sdk_chained_by_previous_response_id_is_one_root
  → tests/proxy/dialects/test_responses_translation.py::test_unknown_or_unstored_previous_response_is_a_400_naming_it
- any FATAL makes a rollout not ok; `reward: null` means never graded
  → tests/proxy/capture/test_validation.py::test_turn_fatal_makes_rollout_not_ok
  → tests/app/test_views.py::test_reward_null_means_never_graded_not_zero
  → tests/runner/test_rewards.py::test_verifier_never_ran_gives_null_and_a_finding_never_zero
  → tests/app/commands/test_downstream_edges.py::test_run_export_keeps_a_never_graded_result_null_even_when_its_session_holds_a_reward
  → tests/app/commands/test_downstream_edges.py::test_a_servers_run_export_keeps_the_results_reward_and_error_kind_over_the_sessions

§ What agents see on the wire
- an Anthropic prefill is continued (as text, also where token-in would take it); logprobs come
  back when Responses or Google callers ask; Anthropic `input_tokens` exclude cached ones;
  malformed fields are a 400 naming them; a turn's findings name their turn
  → tests/proxy/dialects/test_wire_fidelity_embedded.py::test_anthropic_prefill_is_continued_not_answered_after
  → tests/proxy/dialects/test_wire_fidelity_embedded.py::test_a_prefill_after_a_held_turn_goes_as_text_so_it_stays_open
  → tests/proxy/dialects/test_wire_fidelity.py::test_responses_logprobs_come_back_when_included
  → tests/proxy/dialects/test_wire_fidelity.py::test_google_logprobs_come_back_when_asked
  → tests/proxy/dialects/test_wire_fidelity.py::test_anthropic_input_tokens_exclude_the_prompt_tokens_read_from_cache
  → tests/proxy/dialects/test_wire_fidelity.py::test_anthropic_stop_sequences_as_a_string_are_refused_not_split_into_characters
  → tests/proxy/dialects/test_wire_fidelity.py::test_google_wrong_shaped_field_is_a_400_naming_it
  → tests/proxy/dialects/test_wire_fidelity.py::test_responses_malformed_request_is_a_400_naming_the_field
  → tests/proxy/dialects/test_app_hosted_tools_and_google_json_stream.py::test_a_turns_request_findings_name_that_turn
- errors keep their status; a dead engine is a retryable 502 with an `engine_unreachable` finding;
  errors inside a started stream in each dialect's form
  → tests/proxy/dialects/test_agent_quirks.py::test_engine_error_reaches_each_sdk_with_its_real_status
  → tests/proxy/dialects/test_agent_quirks.py::test_dead_engine_gives_each_streaming_sdk_a_retryable_5xx_and_a_session_finding
  → tests/proxy/dialects/test_agent_quirks.py::test_engine_error_after_the_stream_started_is_raised_by_each_sdk
- truncation in each dialect's terms; a lowered output limit is a `max_tokens_capped` finding
  → tests/proxy/dialects/test_agent_quirks.py::test_length_cut_reply_is_truncation_in_each_dialect
  → tests/proxy/dialects/test_agent_quirks.py::test_claude_code_max_tokens_cap_is_a_finding_and_a_cut_is_max_tokens
- system messages stay where the agent put them, folded with a finding when the template refuses
  → tests/proxy/dialects/test_agent_quirks.py::test_claude_code_system_messages_stay_where_the_agent_put_them
  → tests/proxy/dialects/test_agent_quirks.py::test_template_refusing_late_system_messages_folds_them_with_a_finding
- namespace tools are flattened; hosted tools dropped with a finding
  → tests/proxy/dialects/test_agent_quirks.py::test_codex_namespace_tools_round_trip
  → tests/proxy/dialects/test_app_hosted_tools_and_google_json_stream.py::test_dropped_hosted_tools_are_a_warn_finding_on_the_stored_turn
  → tests/proxy/dialects/test_app_hosted_tools_and_google_json_stream.py::test_anthropic_mcp_servers_are_dropped_as_hosted_tools_with_a_finding
- a tool choice limited to a subset goes out as the nearest choice, with a finding when widened
  → tests/proxy/dialects/test_wire_fidelity.py::test_google_allowed_function_names_the_engine_cannot_force_are_a_finding
  → tests/proxy/dialects/test_wire_fidelity.py::test_responses_allowed_tools_subset_is_sent_as_the_nearest_choice_with_a_finding
- JSON mode calls are auxiliary, honoured, never trained; a trained turn is never constrained;
  tool-less calls among tool calls are auxiliary
  → tests/proxy/dialects/test_agent_quirks.py::test_openai_json_schema_modes_are_auxiliary_and_honoured
  → tests/proxy/dialects/test_agent_quirks.py::test_gemini_router_gets_json_from_an_engine_that_ignores_the_schema
  → tests/proxy/dialects/test_agent_quirks.py::test_agent_turn_in_a_training_session_is_never_constrained
  → tests/proxy/capture/test_graph.py::test_tool_bearing_path_is_agent_and_tool_less_root_is_auxiliary
- content held at the provider (Responses `conversation`, stored `prompt`, Google `cachedContent`)
  is a 400 naming the field
  → tests/proxy/dialects/test_wire_fidelity.py::test_responses_conversation_or_stored_prompt_is_refused_not_answered_without_its_content
  → tests/proxy/dialects/test_wire_fidelity.py::test_google_cached_content_is_refused_not_answered_without_it
- tool-call arguments that are not a JSON object reach Anthropic and Google clients as `{}` with a
  finding, and are resent as sampled
  → tests/proxy/dialects/test_wire_fidelity.py::test_tool_arguments_that_are_not_a_json_object_are_a_finding_and_resent_as_sampled
- side calls and dropped reasoning are named
  → tests/proxy/capture/test_graph.py::test_conversation_resent_under_another_system_prompt_is_a_side_call_not_a_break
  → tests/proxy/capture/test_graph.py::test_reply_resent_without_its_sampled_reasoning_is_named_reasoning_dropped
- one access-log line per call, no key
  → tests/proxy/http/test_access_log.py::test_serve_logs_one_line_per_call_with_keys_redacted
  → tests/proxy/dialects/test_agent_quirks.py::test_every_call_writes_one_access_line_without_keys

§ Token-in mode
- a call that extends a held conversation continues from the stored ids plus the new messages'
  template ids; where the text path broke the prefix, token-in keeps it, and where it held, the ids
  are the same (the recorded vLLM break cases)
  → tests/proxy/upstream/test_token_in.py::test_token_in_prompt_extends_the_held_ids_where_text_broke
  → tests/proxy/upstream/test_token_in.py::test_breaks_per_transition_off_and_on
- the close's end token is not repeated when sampled, added after a `length` cut, and another
  sampled end token is kept before it
  → tests/proxy/upstream/test_token_in.py::test_length_cut_gets_the_close_the_model_never_sampled
  → tests/proxy/upstream/test_token_in.py::test_sampled_end_token_is_not_doubled
  → tests/proxy/upstream/test_token_in.py::test_other_end_token_the_model_sampled_is_kept_before_the_close
- template pieces split only at exact message boundaries, else the call goes as text
  → tests/proxy/upstream/test_token_in.py::test_boundary_that_is_not_a_prefix_is_refused
- the harness sees the same reply in its own dialect
  → tests/proxy/upstream/test_token_in.py::test_completion_reply_reads_as_the_chat_capture
  → tests/runner/engine/test_token_in_capture.py::test_token_id_prompt_gives_the_reply_the_chat_route_gives
- fallbacks: not held, engines without `/tokenize` (once per session), engines refusing id prompts
  → tests/proxy/upstream/test_token_in_plan.py::test_calls_that_extend_no_held_reply_take_text_without_asking_the_engine
  → tests/proxy/upstream/test_token_in_plan.py::test_engine_without_tokenize_falls_back_once_and_stays_text
  → tests/proxy/upstream/test_token_in_plan.py::test_engine_refusing_token_prompts_gets_the_call_as_text
- a conversation on the embedded engine at temperature 1 is one chain; the export marks each row's
  mode; replaying a row gives the captured logprobs
  → tests/runner/engine/test_token_in_capture.py::test_token_in_conversation_is_one_chain_with_engine_logprobs
- the Rollout screen marks `⇢ids` / `↩text`
  → tests/app/test_views.py::test_token_in_turns_show_whether_ids_continued_them_or_text_took_over
- calls with tools continue by ids: the same prompt ids as the chat route (tools block included),
  the same replies, tool-call ids, `finish_reason` and streamed deltas, parsed by the one parser the
  embedded engine's chat route runs (vLLM's hermes rules)
  → tests/runner/engine/test_token_in_tools.py::test_tool_calls_by_ids_reach_the_harness_as_by_text
  → tests/proxy/upstream/test_token_in_tools_recorded.py::test_tool_call_sampled_by_ids_reads_back_as_vllms_chat_route_call
  → tests/proxy/upstream/test_token_in_tools_recorded.py::test_turn_after_a_tool_call_continues_by_ids_with_the_hermes_parser
  → tests/runner/engine/test_tool_calls.py::test_block_without_arguments_leaves_the_reply_plain_content_like_vllm_hermes
- tool fallbacks: unknown parser, forced `tool_choice`, legacy `functions`; a reasoning parser sends
  every call as text
  → tests/proxy/upstream/test_token_in_plan.py::test_calls_that_extend_no_held_reply_take_text_without_asking_the_engine
  → tests/proxy/upstream/test_token_in_plan.py::test_unknown_tool_parser_is_named_in_the_fallback
  → tests/proxy/upstream/test_token_in_plan.py::test_engine_with_a_reasoning_parser_sends_every_call_as_text
- a reasoning model with no reasoning parser named is detected from the engine's `/tokenize`:
  every call goes as text with a session finding naming the flag, asked once per engine; a reply
  holding markers gets a turn finding; SmolLM2 has no markers (recorded vLLM, embedded engine)
  → tests/proxy/upstream/test_reasoning_unparsed_session.py::test_reasoning_model_without_a_parser_is_named_once_and_its_calls_go_by_text
  → tests/proxy/upstream/test_reasoning_markers.py::test_reasoning_model_without_a_parser_goes_by_text_and_names_the_flag
  → tests/proxy/upstream/test_reasoning_markers.py::test_engine_is_asked_once_for_every_session
  → tests/proxy/upstream/test_reasoning_markers.py::test_reply_holding_a_think_block_gets_a_turn_finding
  → tests/proxy/upstream/test_reasoning_markers.py::test_smollm2_has_no_reasoning_markers_by_recorded_vllm_tokenize
  → tests/proxy/upstream/test_reasoning_markers.py::test_think_tokenizer_has_reasoning_markers_by_recorded_vllm_tokenize
  → tests/runner/engine/test_token_in_capture.py::test_embedded_engine_answers_the_reasoning_marker_probe_as_vllm_does

§ Running rollouts
- a run is resumable after a crash
  → tests/runner/test_resume.py::test_resume_after_a_crash_runs_only_the_unfinished_rollouts
- a rollout never raises; failures are classified
  → tests/runner/test_rollouts.py::test_engine_down_is_engine_unreachable
  → tests/runner/test_rollouts.py::test_sandbox_start_failure_is_sandbox_failed
  → tests/runner/test_rollouts.py::test_agent_timeout_is_agent_timeout_and_still_graded
  → tests/runner/test_rollouts.py::test_outer_timeout_covers_the_whole_rollout
  → tests/runner/test_runner_units.py::test_exceptions_are_classified_by_type_then_phase
- the reward is `--reward-key`'s key (missing: `reward_key_missing`), else the only key, else
  `reward`; several others are `reward_ambiguous`, listing them
  → tests/runner/test_rewards.py::test_named_reward_key_wins_over_reward
  → tests/runner/test_rewards.py::test_named_reward_key_missing_is_an_error_listing_the_keys
  → tests/runner/test_rewards.py::test_single_key_is_the_reward_whatever_its_name
  → tests/runner/test_rewards.py::test_several_keys_including_reward_take_reward
  → tests/runner/test_rewards.py::test_several_keys_without_reward_are_refused_with_the_keys_listed
- extra calls the trajectory never recorded are demoted to auxiliary (masked out, shown as such,
  kept after a restart); a full trajectory demotes nothing
  → tests/runner/test_atif.py::test_extra_calls_are_demoted_to_auxiliary_and_masked_out_of_training
  → tests/runner/test_atif.py::test_a_trajectory_recording_every_call_demotes_nothing
  → tests/runner/test_atif.py::test_calls_the_trajectory_never_recorded_are_named_for_demotion
  → tests/app/test_views.py::test_rollout_nodes_take_the_roles_the_server_gives
- the rollout settings table's defaults (1/256 of the context, at least 128; 300 s; 3 turns; the
  engine's context, 8,192 otherwise; the sample tasks' 180 s)
  → tests/test_readme_claims.py::test_the_settings_defaults_are_the_codes
  → tests/runner/test_rollout_settings.py::test_context_comes_from_the_engine_and_output_is_a_share_of_it
  → tests/runner/test_rollout_settings.py::test_an_engine_that_does_not_say_gets_the_stated_fallback
  → tests/runner/test_rollout_settings.py::test_timeouts_in_force_say_where_they_came_from
- bad values are refused with the field named (exit 2); settings that do not fit the engine are
  refused before the trial
  → tests/runner/test_rollout_settings.py::test_bad_values_are_refused_with_the_field_named
  → tests/app/commands/test_rollout_settings_cli.py::test_a_bad_setting_is_refused_by_the_server_with_the_field_named
  → tests/runner/test_rollout_settings.py::test_output_tokens_that_do_not_fit_the_engine_are_refused_naming_the_field
  → tests/runner/test_rollout_settings.py::test_a_context_beyond_the_engines_is_refused_naming_the_field
  → tests/runner/test_rollout_settings.py::test_a_harness_whose_first_prompt_cannot_fit_is_refused
  → tests/runner/test_rollout_settings.py::test_settings_that_do_not_fit_fail_the_rollout_before_the_trial
- defaults shown in `--help`, `tapdeck info` and Setup; each result records its settings with
  sources; `tapdeck rollout` prints them; the Runs screen shows them; Setup remembers them per
  harness; old plans' fields fold in
  → tests/app/commands/test_rollout_settings_cli.py::test_rollout_help_shows_every_setting_and_its_default
  → tests/app/commands/test_rollout_settings_cli.py::test_info_shows_the_engines_context_and_the_settings_defaults
  → tests/app/test_tui_recorded.py::test_setup_settings_show_the_engines_defaults_and_keep_tab_order_short
  → tests/app/commands/test_newcomer_path.py::test_default_rollout_is_graded_and_ends_by_its_turn_budget
  → tests/app/test_tui_recorded.py::test_runs_screen_states_each_rollouts_timeouts_and_their_sources
  → tests/app/test_tui_recorded.py::test_setup_rollout_settings_are_sent_and_remembered_per_harness
  → tests/runner/test_rollout_settings.py::test_old_plans_agent_kwargs_and_agent_timeout_fold_into_settings
- datasets: a local folder (one task or many), registry names and git sources, the five offline
  sample tasks
  → tests/runner/test_datasets.py::test_a_local_task_folder_is_one_task
  → tests/runner/test_datasets.py::test_a_local_folder_of_tasks_lists_valid_subfolders_sorted
  → tests/runner/test_datasets.py::test_remote_specs_map_to_harbor_dataset_configs
  → tests/runner/sandboxes/test_host_sandbox.py::test_oracle_solves_every_sample_task
- harnesses: the seam table; only the session key reaches a harness
  → tests/runner/test_harnesses.py::test_table_rows_are_plain_and_only_what_ran_here_is_validated
  → tests/runner/test_harnesses.py::test_harbor_resolves_only_the_session_key_even_with_real_keys_on_the_host
- sandboxes: Harbor's backends available only when they import and pass preflight; the host
  sandbox's mounts, private HOME and TMUX_TMPDIR, loopback-only network, rootless mode
  → tests/runner/test_catalog_info.py::test_sandbox_catalog_lists_host_and_every_harbor_backend
  → tests/runner/sandboxes/test_host_sandbox.py::test_exec_env_is_clean_and_has_a_private_tmux_tmpdir
  → tests/runner/sandboxes/test_host_sandbox.py::test_no_network_task_gets_loopback_only
  → tests/runner/sandboxes/test_host_sandbox.py::test_rootless_trial_runs_in_its_own_root_and_makes_nothing_on_the_host
  → tests/runner/sandboxes/test_host_sandbox.py::test_kill_9_of_the_server_kills_every_process_of_its_trial_tmux_included
  → tests/runner/sandboxes/test_host_sandbox.py::test_the_trial_folders_a_killed_process_left_are_removed_when_the_next_trial_starts
  → tests/runner/sandboxes/test_host_sandbox.py::test_a_command_printing_without_end_returns_only_its_last_output
  → tests/runner/sandboxes/test_host_sandbox.py::test_trials_whose_folders_lie_outside_tmp_cannot_reach_each_others_workspace
  → tests/runner/test_rollouts.py::test_a_task_needing_compose_services_is_bad_task_naming_them
  → tests/runner/sandboxes/test_host_sandbox.py::test_trials_cut_off_from_the_network_each_serve_the_same_port_on_their_own_loopback
  → tests/runner/sandboxes/test_mount_points.py::test_the_last_user_removes_the_directories_it_made_and_nothing_else
- engines: address forms, `/v1/models` then `/models`, one line naming every URL tried
  → tests/proxy/upstream/test_engine_address.py::test_an_address_without_a_path_is_asked_at_v1_then_at_the_root
  → tests/proxy/upstream/test_engine_address.py::test_a_wrong_address_is_one_line_naming_every_url_tried
- an engine's API key comes from `--engine-api-key` or `$TAPDECK_ENGINE_API_KEY` (also for a
  rollout's URL engine) and reaches no harness or sandbox
  → tests/runner/test_runner_units.py::test_url_engine_without_a_key_takes_the_engine_api_key_from_the_environment
  → tests/proxy/upstream/test_complete.py::test_api_key_sent_as_bearer
  → tests/runner/sandboxes/test_host_sandbox.py::test_server_secrets_never_reach_the_trial_environment
- terminus-2's small-model defaults and the 3 × max_turns call budget
  → tests/runner/test_harnesses.py::test_terminus2_gets_the_small_model_defaults
  → tests/test_readme_claims.py::test_the_settings_defaults_are_the_codes
  → tests/proxy/http/test_auth_and_failures.py::test_budget_reached_gives_a_non_empty_stop_and_no_node
- the embedded engine's 32,768-token context reported as `max_model_len`; `--n-ctx` and the KV-cache
  reuse; one engine per machine, whose owner's pid `rollout` and `serve` name when they reuse it
  → tests/test_readme_claims.py::test_the_settings_defaults_are_the_codes
  → tests/runner/engine/test_long_context.py::test_engine_reports_its_stretched_context_as_max_model_len
  → tests/runner/engine/test_long_context.py::test_follow_up_with_a_shared_10k_prefix_evaluates_only_the_new_tokens
  → tests/runner/engine/test_settle.py::test_a_settle_that_gives_way_leaves_a_cache_whose_reuse_equals_a_fresh_prefill
  → tests/runner/engine/test_settle.py::test_a_caller_waiting_for_the_model_stops_the_settle_of_the_reply_before_it
  → tests/runner/engine/test_registry.py::test_second_process_reuses_the_running_engine
  → tests/runner/engine/test_registry.py::test_engine_with_another_context_is_not_reused
  → tests/app/commands/test_rollout_shared_engine.py::test_rollout_names_the_reused_engine_and_stops_when_it_goes_away
  → tests/runner/engine/test_registry.py::test_serve_on_a_reused_engine_names_the_process_that_serves_it
- `tapdeck info` reports the running embedded engine, probed
  → tests/app/commands/test_info_running_engine.py::test_info_reports_the_running_embedded_engine_with_its_tier
- it serves the shipped Q4_1 GGUF re-encoded once as F16, which the trainer dequantises to the
  same weights
  → tests/runner/engine/test_model_file.py::test_first_use_converts_the_shipped_file_to_f16_once_keyed_by_name_size_and_version
  → tests/runner/recipes/test_cpu_grpo.py::test_cpu_grpo_trains_on_tapdeck_rollouts_from_its_current_weights

§ Agent CLIs
- the pinned versions in the README are the installer's
  → tests/test_readme_claims.py::test_the_agent_versions_are_the_pinned_ones
- installed once, recorded, offline afterwards
  → tests/runner/test_agent_install.py::test_every_seed_agent_is_pinned_with_its_registry
  → tests/runner/test_agent_install.py::test_install_of_an_installed_agent_does_nothing_and_returns_its_record
- validated agents ran the sample task end to end; a dead engine is `engine_unreachable` for all six
  → tests/runner/test_agent_rollouts.py::test_agent_cli_runs_a_sample_task_offline_with_every_turn_captured
  → tests/runner/test_agent_rollouts.py::test_dead_engine_ends_the_agent_and_is_engine_unreachable
- only the session key and the proxy reach an agent CLI
  → tests/runner/test_harnesses.py::test_agent_clis_get_only_the_session_key_and_the_proxy
- retries cut to one where the CLI has a setting for it (no client retries under its own attempts)
  → tests/runner/test_cli_agent_retries.py::test_mini_swe_agent_retries_only_by_its_own_attempts
  → tests/runner/test_cli_agent_retries.py::test_qwen_code_openai_client_does_not_retry_under_its_own_retry_loop
- qwen-code's managed-memory sub-agent is off: after a length-cut reply its calls stay one conversation
  → tests/runner/test_agent_binaries.py::test_qwen_code_after_a_length_cut_reply_stays_in_the_tasks_conversation
- an agent CLI started from Setup runs to the verifier's reward, shown on the Runs screen
  → tests/app/screens/test_agent_from_setup.py::test_agent_cli_started_from_setup_finishes_with_its_turns_on_the_runs_screen

§ Lean tool profile
- the lean profile sends only the task tools through each CLI's own settings, keeps its own loop,
  and shrinks its first prompt below the full figure
  → tests/runner/test_agent_binaries.py::test_lean_profile_sends_only_the_task_tools_and_keeps_the_agents_loop
- an unknown profile is refused naming the profiles
  → tests/runner/test_harnesses.py::test_an_unknown_tool_profile_is_refused_naming_the_profiles
- the fit check uses the lean figures when the profile is lean
  → tests/runner/test_rollout_settings.py::test_a_lean_tool_profile_fits_where_the_full_first_prompt_does_not
- the sample-task test runs each agent with its lean profile
  → tests/runner/test_agent_rollouts.py::test_agent_cli_runs_a_sample_task_offline_with_every_turn_captured

§ Remote sandboxes: `--public-url`
- sessions advertise the public URL; an unreachable one fails as `proxy_unreachable` naming it
  → tests/runner/test_public_url.py::test_sessions_advertise_the_public_url_for_every_dialect
  → tests/runner/test_public_url.py::test_unreachable_public_url_is_a_clear_error_naming_it
  → tests/runner/test_agent_rollouts.py::test_unreachable_public_url_fails_the_rollout_before_any_model_call

§ The TUI
- opens on Setup without sessions, on Sessions otherwise; number keys switch screens
  → tests/app/test_tui_recorded.py::test_tui_opens_on_setup_when_the_server_has_no_sessions_yet
  → tests/app/test_tui_recorded.py::test_tui_opens_on_sessions_when_the_server_has_sessions
  → tests/app/test_tui_recorded.py::test_number_keys_switch_screens_and_resize_does_not_crash
- Setup's 5 alternatives by default; each choice says why not; Rollout settings panel
  → tests/app/test_tui_recorded.py::test_setup_plan_captures_five_alternatives_unless_told_otherwise
  → tests/app/test_tui_recorded.py::test_setup_refuses_an_unavailable_sandbox_with_the_reason
  → tests/app/test_tui_recorded.py::test_setup_rollout_settings_are_sent_and_remembered_per_harness
- Sessions updated by diff; Rollout tree, tokens, alternatives; Runs groups and failures
  → tests/app/test_tui_recorded.py::test_sessions_table_shows_states_and_updates_only_changed_cells
  → tests/app/widgets/test_rollout_tree.py::test_a_growing_chain_is_listed_flat_and_a_fork_nests_its_branches
  → tests/app/test_tui_recorded.py::test_open_rollout_and_click_a_token_shows_its_logprob
  → tests/app/test_tui_recorded.py::test_runs_screen_shows_groups_and_failures_by_cause
- Runs counts cancelled rollouts apart from failed ones
  → tests/app/test_tui_recorded.py::test_runs_counts_cancelled_rollouts_apart_from_failed_ones
- help, palette, theme remembered, key map by id; attach is one code path
  → tests/app/test_tui_recorded.py::test_help_opens_with_f1_and_question_mark_and_closes_with_escape
  → tests/app/test_tui_recorded.py::test_command_palette_offers_tapdeck_actions
  → tests/app/test_tui_recorded.py::test_theme_switch_is_remembered
  → tests/app/test_tui_recorded.py::test_keymap_from_settings_rebinds_by_binding_id
  → tests/app/commands/test_attach.py::test_attach_shows_a_remote_session_with_its_turn_and_quits_leaving_the_server_up
- a TUI whose server stops says so, reconnects when it is back with the same sessions (interrupted
  ones as `interrupted`); a stopping server ends event streams and calls in flight without a traceback
  → tests/app/test_tui_multi_client.py::test_an_attached_tui_reconnects_to_a_server_restarted_on_its_data_dir
  → tests/app/test_host.py::test_stopping_the_server_ends_its_event_streams_cleanly_without_a_traceback
- a run another client cancels leaves no `queued` row on Sessions
  → tests/app/test_tui_multi_client.py::test_a_run_another_client_cancels_leaves_no_queued_row_on_sessions
- after a reconnect Runs shows runs as the restarted server has them, unrun rollouts as `not run`
  → tests/app/test_tui_multi_client.py::test_runs_after_a_reconnect_shows_the_run_as_the_restarted_server_has_it_and_unrun_rollouts_as_not_run

§ Training
- jobs run on the server's machine, stream log and metrics, stop by process group, record why they
  died, stop with the server
  → tests/runner/test_train_api.py::test_data_check_job_streams_its_log_metrics_and_state_over_sse
  → tests/runner/test_train_api.py::test_stop_over_http_ends_a_running_job_and_its_process_group
  → tests/runner/test_train_api.py::test_a_run_that_dies_says_why
  → tests/runner/test_train_api.py::test_the_server_stops_its_running_jobs_when_it_shuts_down
- `train --list`, the Train screen and attach
  → tests/app/commands/test_train_cli.py::test_train_list_says_what_the_server_can_start
  → tests/app/screens/test_train_screen.py::test_train_screen_launches_data_check_on_the_server_and_plots_its_metrics
  → tests/app/screens/test_train_attach.py::test_attached_tui_launches_a_recipe_on_the_server_sees_a_metric_and_stops_it
- `grpo-trl` can start only where the server sees 2 GPUs
  → tests/app/commands/test_train_cli.py::test_a_recipe_that_needs_gpus_cannot_start_on_a_server_without_them
  → tests/app/commands/test_train_cli.py::test_gpu_count_decides_a_gpu_recipe_is_unavailable_and_says_why
  → tests/app/test_tui_recorded.py::test_train_refuses_a_recipe_the_server_cannot_start_saying_why
- `tapdeck train` refuses data-check given neither `--run` nor `--rows` before any job starts
  → tests/app/commands/test_train_cli.py::test_train_without_the_rows_its_recipe_reads_is_refused_before_a_job_starts
- data-check given both `--run` and `--rows`, or its own `--run` after `--`, is refused before a
  job starts, in one line saying which to give
  → tests/app/commands/test_downstream_edges.py::test_train_refuses_recipe_args_that_name_the_runs_rows_or_run_again_before_a_job_starts
- a job's log gives the `trackio show` command that shows the job's own trackio folder
  → tests/app/commands/test_train_cli.py::test_train_output_gives_the_trackio_show_command_that_shows_this_job
- `--run` with cpu-grpo, or a `--run` that is a path, is refused with exit 2; the Train screen
  passes its picked run to grpo-trl, which reads the run itself
  → tests/app/test_tui_recorded.py::test_train_passes_the_picked_run_to_a_recipe_that_reads_runs_itself
  → tests/app/commands/test_downstream_edges.py::test_train_refuses_a_run_for_a_recipe_that_takes_none
  → tests/app/commands/test_downstream_edges.py::test_train_refuses_a_run_id_that_is_a_path_as_bad_usage
- data-check fails (exit 2, `nothing to check`) when no rollout is left to check
  → tests/app/commands/test_downstream_edges.py::test_data_check_with_no_rollout_fails_saying_there_is_nothing_to_check
  → tests/app/commands/test_downstream_edges.py::test_data_check_with_only_failed_rollouts_fails_saying_they_were_left_out
- a `--run` whose rollouts give no training row (all eval tier) is refused before a job starts
  (exit 1, saying why); some that give none are named in its log; one still going is read as far
  as it got, with a warning saying how far
  → tests/app/commands/test_downstream_edges.py::test_train_refuses_a_run_whose_rollouts_are_all_eval_tier_saying_so
  → tests/app/commands/test_downstream_edges.py::test_train_on_a_run_still_going_warns_that_it_reads_what_is_done_so_far
  → tests/app/commands/test_downstream_edges.py::test_train_names_the_rollouts_of_a_run_that_gave_no_training_row_in_its_log
- recipe args the recipe's own parser refuses are bad usage (exit 2) before a job starts
  → tests/app/commands/test_train_cli.py::test_train_refuses_recipe_args_its_parser_refuses_as_bad_usage_before_a_job_starts
- the server reads every trackio run in a job's own `trackio/` folder, whatever a recipe called it
  → tests/app/commands/test_downstream_edges.py::test_metrics_of_a_recipe_that_renamed_its_trackio_run_and_project_still_reach_the_api
- the launcher refuses a recipe whose environment is missing, giving the command that makes it
  → tests/app/commands/test_downstream_edges.py::test_a_missing_training_environment_names_the_whole_command_that_makes_it_there
- data-check and cpu-grpo do what they say
  → tests/runner/recipes/test_data_check.py::test_data_check_logs_grpo_advantages_readable_by_the_reader
  → tests/runner/recipes/test_data_check.py::test_data_check_reads_a_parquet_export_as_it_reads_the_jsonl
  → tests/runner/recipes/test_data_check.py::test_data_check_leaves_out_rollouts_that_did_not_end_ok
  → tests/runner/recipes/test_cpu_grpo.py::test_cpu_grpo_trains_on_tapdeck_rollouts_from_its_current_weights
  → tests/runner/recipes/test_cpu_grpo.py::test_format_score_gives_partial_credit_for_terminus_json
- the admin key reaches a recipe but never its record
  → tests/runner/test_train_api.py::test_admin_key_reaches_the_recipe_but_never_its_record

§ The training environment
- the pinned versions in the README are `scripts/train-env.txt`'s
  → tests/test_readme_claims.py::test_the_training_environment_versions_are_the_pinned_ones
- made once and reused; recipes see this checkout as `tapdeck`
  → tests/runner/test_train_env.py::test_making_the_environment_twice_reuses_it
  → tests/runner/test_train_env.py::test_the_pythonpath_link_a_recipe_gets_holds_only_this_checkout_as_tapdeck
  → tests/runner/test_train_env.py::test_recipe_modules_and_the_training_stack_import_in_the_training_environment

§ grpo-trl against TRL's own code
- TRL's loop is built from the kwargs the worker forwards and trains on exactly what tapdeck
  captured; a non-existent task is refused when its session is created
  → tests/runner/recipes/test_trl_harness_loop.py::test_trls_rollout_loop_trains_on_exactly_what_tapdeck_captured
  → tests/runner/recipes/test_grpo_trl.py::test_unknown_task_is_refused_at_create_naming_the_task
- sessions enforce the trainer's sampling (truncating knobs at no-ops, else 422)
  → tests/runner/recipes/test_grpo_trl.py::test_a_training_session_samples_at_the_trainers_temperature_and_passes_the_gate
  → tests/proxy/upstream/test_prepare.py::test_training_policy_must_be_full_vocabulary
- unusable rollouts are RuntimeErrors, never TRL's contract errors
  → tests/runner/recipes/test_grpo_trl.py::test_rollouts_trl_must_not_train_on_are_unscorable_not_contract_errors
- `--run` is never read as `--run-name`; each launch has its own run name
  → tests/runner/recipes/test_grpo_trl.py::test_run_is_its_own_flag_never_a_prefix_of_run_name
  → tests/runner/recipes/test_grpo_trl.py::test_each_launch_gets_its_own_run_name_and_output_dir
- `--print-vllm-command` prints vLLM's flags
  → tests/runner/recipes/test_grpo_trl.py::test_vllm_command_carries_the_flags_trl_and_capture_need

§ data-check equals TRL
- rows, tallies and advantages equal TRL's
  → tests/runner/recipes/test_data_check_equals_trl.py::test_data_check_rows_tallies_and_advantages_equal_trls

§ Reliability
- a store fault (disk full, read-only, locked) is a 503 in the caller's dialect; memory matches
  disk; the next call after the fault is captured; opening a session on a refusing store is a 503
  → tests/proxy/store/test_store_faults.py::test_store_fault_answers_503_and_memory_matches_disk
  → tests/proxy/store/test_store_faults.py::test_opening_a_session_on_a_refusing_store_is_a_503
- `kill -9` under load loses no turn whose reply was sent
  → tests/proxy/store/test_crash_under_load.py::test_kill_9_under_load_loses_no_replied_turn
- a batch killed with `kill -9` keeps every delivered turn, leaves no trial process, and resumes
  only its unfinished rollouts
  → tests/runner/test_kill_9_batch.py::test_kill_9_mid_batch_keeps_every_delivered_turn_and_resume_runs_only_the_unfinished_rollouts
- nothing holds the event loop: calls are captured while every reader thread is held
  → tests/proxy/store/test_loop_never_blocks.py::test_commits_complete_while_slow_exports_hold_every_reader_thread
- closed sessions release their live state; Responses are bounded and never loop; repeated engine
  ids still chain
  → tests/proxy/sessions/test_session_lifetime.py::test_closed_sessions_release_their_live_state
  → tests/proxy/sessions/test_session_lifetime.py::test_stored_responses_are_bounded_and_a_chain_never_loops
  → tests/proxy/sessions/test_session_lifetime.py::test_an_engine_repeating_reply_ids_still_chains_responses
- the tool-argument memo is per session; the call budget holds under concurrent calls
  → tests/proxy/sessions/test_session_isolation.py::test_tool_arguments_sampled_in_one_session_never_render_another
  → tests/proxy/sessions/test_concurrent_budget.py::test_budget_holds_while_commits_are_pending

- every model route in four dialects and every admin route answers fuzzed input with a 4xx in its
  own envelope, never a 5xx or a traceback
  → tests/proxy/http/test_fuzz_routes.py
- engine faults are 502s with a non-empty, credential-free message
  → tests/proxy/upstream/test_engine_faults.py
- a trial never sees the server's keys nor the data dir; the data dir and database are private; admin keys from a
  file or the environment, weak ones refused on a public bind
  → tests/runner/sandboxes/test_host_sandbox.py::test_server_secrets_never_reach_the_trial_environment
  → tests/runner/sandboxes/test_host_sandbox.py::test_a_trial_printing_its_environment_sees_no_server_key
  → tests/runner/sandboxes/test_host_sandbox.py::test_a_hidden_host_directory_shows_empty_and_read_only_in_the_trial
  → tests/runner/test_rollouts.py::test_a_host_sandbox_rollout_cannot_see_or_change_the_data_dir
  → tests/proxy/test_config_and_keys.py::test_data_dir_and_capture_db_are_owner_only_even_when_they_existed
  → tests/proxy/test_config_and_keys.py::test_admin_key_file_is_read_and_refused_when_empty
  → tests/app/test_host.py::test_serve_cli_reads_the_admin_key_from_a_file_and_refuses_weak_ones_on_public_binds
  → tests/proxy/test_config_and_keys.py::test_a_weak_admin_key_is_refused_on_a_public_bind_only

§ Tests and benchmarks
- nothing in the suite asserts on wall-clock time
  → tests/test_readme_claims.py::test_no_test_asserts_on_wall_clock_time

§ Proxy throughput
- a burst of concurrent sessions loses no call and captures every turn; idle client connections
  outlive the clients' own keep-alive
  → tests/proxy/http/test_burst.py::test_burst_of_concurrent_sessions_loses_no_call_and_captures_every_turn
  → tests/proxy/http/test_burst.py::test_idle_client_connection_outlives_the_clients_own_keepalive
- two `tapdeck serve` processes serve one batch with every turn captured
  → tests/proxy/http/test_burst.py::test_two_serve_processes_share_one_batch_and_capture_every_turn
- the server's loop is uvloop; batches run on the runner's own asyncio loop, where a detached tmux
  returns, and a cancelled run is awaited until its teardown
  → tests/runner/test_runner_loop.py::test_a_run_started_from_uvloop_runs_on_asyncio_and_its_detached_tmux_returns
  → tests/runner/test_runner_loop.py::test_cancelling_a_run_from_the_server_loop_waits_for_its_teardown
  → tests/runner/test_terminus2.py::test_terminus2_rollout_is_graded_captured_on_every_turn_and_reconciled
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
NAMED = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def _sections() -> list[str]:
    """The README's headings (`#` to `###`), code blocks left out."""
    prose = re.sub(r"^```.*?^```", "", README, flags=re.M | re.S)
    return [line.strip("# ").strip() for line in prose.splitlines() if re.match(r"^#{1,3} \S", line)]


def test_every_named_test_exists() -> None:
    named = NAMED.findall(__doc__ or "")
    assert len(named) > 100
    missing = [f"{path}::{name}" for path, name in named
               if not (ROOT / path).is_file()
               or not re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(), re.M)]
    assert not missing, missing


def test_every_readme_section_lists_its_claims() -> None:
    listed = [line[2:].strip() for line in (__doc__ or "").splitlines() if line.startswith("§ ")]
    assert [s for s in _sections() if s not in listed] == []
    assert [s for s in listed if s not in _sections()] == []


def test_the_command_table_names_every_command_the_cli_has() -> None:
    from typer.main import get_command

    from tapdeck.app.cli import app

    table = README.split("## Command line", 1)[1].split("\n\n", 2)[1]
    documented = set(re.findall(r"^\| `tapdeck (\w+)", table, re.M))
    documented |= {"tui"} if "`tapdeck tui`" in table else set()
    commands = set(get_command(app).commands)  # type: ignore[attr-defined]
    assert documented == commands


def test_the_data_dir_listing_names_every_file_a_server_leaves_there(tmp_path: Path) -> None:
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig
    from tests.support.fake_vllm import models_only_engine

    listing = README.split("Data lives in `--data-dir`", 1)[1].split("\n\n", 1)[0]
    data = tmp_path / "data"
    with models_only_engine() as engine, LocalServer(ServerConfig(port=0, data_dir=data,
                                                                  engine_url=engine)):
        # SQLite's own -wal and -shm files go with `capture.db (SQLite, WAL)`.
        made = {re.sub(r"-(wal|shm)$", "", p.name) for p in data.iterdir()}
    assert {"capture.db", "admin.key", "admin.key.lock"} <= made
    assert [name for name in sorted(made) if f"`{name}`" not in listing] == []


def test_the_agent_versions_are_the_pinned_ones() -> None:
    from tapdeck.runner.agent_install import PACKAGES

    table = dict(re.findall(r"^\| ([\w-]+) (\d+\.\d+\.\d+) \|", README, re.M))
    assert set(table) == set(PACKAGES)
    assert table == {name: p.version for name, p in PACKAGES.items()}


def test_the_training_environment_versions_are_the_pinned_ones() -> None:
    section = README.split("### The training environment", 1)[1].split("\n### ", 1)[0]
    claimed = dict(re.findall(r"\b(torch|trl|openenv|transformers|trackio)\s+(\d+\.\d+\.\d+)", section))
    pins = dict(re.findall(r"^([\w-]+)==(\S+)$", (ROOT / "scripts" / "train-env.txt").read_text(), re.M))
    assert len(claimed) == 5 and all(pins[name] == version for name, version in claimed.items())


def test_every_admin_route_of_the_table_exists_on_the_server(tmp_path: Path) -> None:
    from tapdeck.proxy.http.app import create_app
    from tapdeck.proxy.service import CaptureService
    from tapdeck.proxy.store.database import Store
    from tapdeck.runner.api import create_runner_router

    service = CaptureService(Store(tmp_path / "capture.db"), default_engine=None,
                             public_url="http://127.0.0.1:9")
    app = create_app(service, admin_key="k", routers=[
        create_runner_router(service, data_dir=tmp_path, default_engine=None)])
    served = {(method.upper(), re.sub(r"\{\w+\}", "{}", path))
              for path, ops in app.openapi()["paths"].items() for method in ops}
    table = README.split("## The server API", 1)[1].split("\nModel routes", 1)[0]
    claimed: set[tuple[str, str]] = set()
    for row in re.findall(r"^\| (`[A-Z]+ .*?) \|", table, re.M):
        method = prefix = ""
        for item in re.findall(r"`([^`]+)`", row.split(" | ")[0]):
            if " " in item:
                method, path = item.split(" ", 1)
            else:  # `/metrics?after=`: the previous route's parent with this last step
                path = prefix + item
            path = path.split("?", 1)[0]
            prefix = path.rsplit("/", 1)[0]
            for variant in _expand(path):
                claimed.add((method, re.sub(r"\{\w+\}", "{}", variant)))
    assert len(claimed) >= 20
    assert claimed <= served, sorted(claimed - served)


def _expand(path: str) -> list[str]:
    """`/runs[/{id}]` → both; `/{id}/cancel\\|resume` → each."""
    if m := re.search(r"\[([^\]]+)\]", path):
        return _expand(path[:m.start()] + path[m.end():]) + _expand(path[:m.start()] + m[1] + path[m.end():])
    if "\\|" in path:
        head, _, tail = path.rpartition("/")
        return [f"{head}/{alt}" for alt in tail.split("\\|")]
    return [path]


def test_the_settings_defaults_are_the_codes() -> None:
    from tapdeck.app.screens.setup import DEFAULT_ALTERNATIVES
    from tapdeck.runner.engine.model import DEFAULT_N_CTX
    from tapdeck.runner.rollout import BUDGET_PER_TURN
    from tapdeck.runner.rollout_settings import DEFAULT_HARD_LIMIT_S, DEFAULT_MAX_TURNS, FALLBACK_CONTEXT_TOKENS, MIN_OUTPUT_TOKENS, OUTPUT_SHARE, default_output_tokens

    assert f"has a {DEFAULT_N_CTX:,}-token context" in README
    assert f"1/{OUTPUT_SHARE} of the context, at least {MIN_OUTPUT_TOKENS} " \
           f"({default_output_tokens(DEFAULT_N_CTX)} on the embedded engine, " \
           f"{default_output_tokens(131072)} at 128k)" in README
    assert f"{DEFAULT_HARD_LIMIT_S:g} s for the whole rollout" in README
    assert f"| `--max-turns` | {DEFAULT_MAX_TURNS} (" in README
    assert f"{FALLBACK_CONTEXT_TOKENS:,} if it lists none" in README
    assert f"call budget of {BUDGET_PER_TURN} × max_turns" in README
    assert f"{DEFAULT_ALTERNATIVES} by default" in README
    sample = ROOT / "runner" / "sample_dataset"
    timeouts = {tomllib.loads((t / "task.toml").read_text())["agent"]["timeout_sec"]
                for t in sample.iterdir() if (t / "task.toml").is_file()}
    assert timeouts == {180.0} and "(180 s on the sample tasks)" in README


def test_no_test_asserts_on_wall_clock_time() -> None:
    elapsed = re.compile(r"assert[^\n]*(time\.(monotonic|time|perf_counter)\(\)|elapsed|duration)"
                         r"[^\n]*[<>]=?\s*\d")
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
                 if elapsed.search(p.read_text())]
    assert offenders == []
