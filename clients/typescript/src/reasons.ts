// Code generated from pkg/failure's registry (reasons.go) by its test
// TestU2_TheTypeScriptClientKnowsEveryReason; DO NOT EDIT. After a change
// of the registry: TETHER_UPDATE_REASONS=1 go test -run U2 ./failure (in pkg/).

/** A stable tether failure reason (SPEC.md): the reason of a google.rpc.ErrorInfo of domain "tether". */
export type Reason =
  | "attach_already_open"
  | "attach_open_required"
  | "backup_archive_corrupt"
  | "backup_archive_missing"
  | "backup_checkpoint_not_found"
  | "backup_digest_mismatch"
  | "backup_identity_mismatch"
  | "backup_manifest_mismatch"
  | "backup_metadata_disabled"
  | "backup_provider_pack_root_not_allowed"
  | "backup_staging_unsafe"
  | "backup_stamp_checkpoint_missing"
  | "backup_stamp_incomplete"
  | "backup_stamp_lease_mismatch"
  | "backup_stamp_manifest_mismatch"
  | "backup_stamp_signature_invalid"
  | "backup_store_failed"
  | "backup_upload_header_missing"
  | "budget_exhausted"
  | "caller_not_authorized"
  | "caller_unauthenticated"
  | "canceled"
  | "checkpoint_deletion_unavailable"
  | "command_id_reused"
  | "command_invalid"
  | "command_unsupported"
  | "controller_seq_not_contiguous"
  | "deadline_exceeded"
  | "durable_handoff"
  | "execution_indeterminate"
  | "executor_draining"
  | "gateway_capacity_exhausted"
  | "gateway_capacity_invalid"
  | "gateway_grant_invalid"
  | "gateway_id_conflict"
  | "gateway_lost_wait_exceeded"
  | "gateway_not_found"
  | "gateway_registration_unauthenticated"
  | "governed_wait_interaction_missing"
  | "idle_timeout"
  | "interaction_already_answered"
  | "interaction_answer_invalid"
  | "interaction_not_found"
  | "internal"
  | "invalid_request"
  | "key_file_invalid"
  | "key_file_unsafe"
  | "native_cancellation_coordinator_missing"
  | "native_cancellation_pending_recovery"
  | "native_event_replay_conflict"
  | "native_execution_binding_changed"
  | "native_finalization_lease_busy"
  | "native_provider_plan_too_large"
  | "native_result_pending_finalization"
  | "native_run_already_terminal"
  | "native_run_coordinator_missing"
  | "native_run_failed"
  | "native_run_terminal_invalid"
  | "native_runner_process_exited"
  | "native_session_close_unrecoverable"
  | "native_session_interrupted"
  | "native_session_lease_lost"
  | "native_session_lease_ttl_invalid"
  | "native_session_not_active"
  | "native_session_retry_exhausted"
  | "native_session_supervisor_busy"
  | "native_session_supervisor_checkpoint_mismatch"
  | "native_tool_authority_epoch_revoked"
  | "no_active_turn"
  | "outbox_soft_limit"
  | "outbox_write_failed"
  | "p0_storage_exhausted"
  | "page_token_filter_mismatch"
  | "page_token_invalid"
  | "peer_not_authorized"
  | "planning_mode_unsupported"
  | "post_dispatch_db_failure"
  | "provider_closed"
  | "provider_config_invalid"
  | "provider_error"
  | "provider_frame_too_large"
  | "provider_initialize_protocol_error"
  | "provider_initialize_timeout"
  | "provider_interrupt_failed"
  | "provider_not_admitted"
  | "provider_process_exited"
  | "provider_process_lost"
  | "provider_process_status_failed"
  | "provider_protocol_error"
  | "provider_reconcile_failed"
  | "provider_request_timeout"
  | "provider_resolved"
  | "provider_server_request_unsupported"
  | "provider_spawn_failed"
  | "provider_start_failed"
  | "provider_stdout_closed"
  | "provider_steer_failed"
  | "provider_thread_already_open"
  | "provider_thread_mismatch"
  | "provider_thread_not_open"
  | "provider_thread_resume_failed"
  | "provider_thread_resume_mismatch"
  | "provider_thread_start_failed"
  | "provider_transport_failed"
  | "provider_turn_active"
  | "provider_turn_failed"
  | "provider_turn_missing"
  | "provider_turn_start_failed"
  | "provider_unknown_turn"
  | "quota_queued_runs"
  | "quota_warm_sessions"
  | "run_holds_current_checkpoint"
  | "run_id_ambiguous"
  | "run_id_conflict"
  | "run_not_attached"
  | "run_not_ended"
  | "run_not_found"
  | "runner_artifact_unavailable"
  | "runner_attach_failed"
  | "runner_attachment_superseded"
  | "runner_attempt_fenced"
  | "runner_auth_failed"
  | "runner_backpressure"
  | "runner_command_failed"
  | "runner_connection_stale"
  | "runner_continuity_break_archive_failed"
  | "runner_credential_expired"
  | "runner_direct_wss_failed"
  | "runner_disconnected"
  | "runner_durable_identity_too_large"
  | "runner_environment_lease_mismatch"
  | "runner_exiting"
  | "runner_gateway_draining"
  | "runner_gateway_lost"
  | "runner_gateway_unavailable"
  | "runner_handshake_timeout"
  | "runner_harness_backup_changed"
  | "runner_harness_backup_lease_missing"
  | "runner_harness_backup_manifest_invalid"
  | "runner_harness_backup_not_canonical"
  | "runner_harness_backup_path_too_deep"
  | "runner_harness_backup_scope_invalid"
  | "runner_harness_backup_unavailable"
  | "runner_harness_backup_unreadable"
  | "runner_harness_backup_unsafe_directory"
  | "runner_harness_backup_unsupported_entry"
  | "runner_harness_backup_unverified"
  | "runner_harness_identity_mismatch"
  | "runner_harness_provider_unsupported"
  | "runner_harness_state_mismatch"
  | "runner_ingress_bind_conflict"
  | "runner_ingress_unavailable"
  | "runner_local_connect_failed"
  | "runner_not_found"
  | "runner_protocol_error"
  | "runner_remote_artifact_contract_incompatible"
  | "runner_remote_checkpoint_archive_duplicate_entry"
  | "runner_remote_checkpoint_archive_expanded_too_large"
  | "runner_remote_checkpoint_archive_invalid"
  | "runner_remote_checkpoint_archive_too_large"
  | "runner_remote_checkpoint_archive_too_many_entries"
  | "runner_remote_checkpoint_archive_unsafe_entry"
  | "runner_remote_checkpoint_archive_unsafe_mode"
  | "runner_remote_checkpoint_archive_unsafe_path"
  | "runner_remote_checkpoint_exclusion_invalid"
  | "runner_remote_checkpoint_restore_failed"
  | "runner_remote_checkpoint_snapshot_failed"
  | "runner_remote_checkpoint_source_missing"
  | "runner_remote_checkpoint_target_unsafe"
  | "runner_remote_provider_artifact_incompatible"
  | "runner_remote_transport_capability_missing"
  | "runner_state_directory_unsafe"
  | "runner_state_identity_mismatch"
  | "runner_state_io_failed"
  | "runner_state_missing"
  | "runner_state_unreadable"
  | "runner_state_write_failed"
  | "runner_stopped"
  | "runner_terminated"
  | "runner_ticket_replayed"
  | "runner_transport_ineligible"
  | "runtime_request_no_longer_pending"
  | "runtime_request_not_pending"
  | "runtime_request_rejected"
  | "runtime_request_resolution_conflict"
  | "runtime_request_resolution_invalid"
  | "runtime_request_resolution_unsupported"
  | "runtime_request_stale_turn"
  | "schema_outdated"
  | "secret_not_found"
  | "secret_unreadable"
  | "semantic_tool_timeout"
  | "session_closed"
  | "session_not_found"
  | "session_scope_moving"
  | "steering_rejected"
  | "steering_stale_turn"
  | "steering_temporarily_unavailable"
  | "steering_timeout"
  | "steering_unsupported"
  | "tool_call_not_pending"
  | "tool_result_invalid"
  | "tool_result_rejected"
  | "transport_reconnect_deadline_exceeded"
  | "turn_already_active"
  | "turn_ended"
  | "turn_mismatch"
  | "waiting_for_gateway"
  | "warm_session_close_backup_failed"
  | "warm_session_replaced"
  | "watch_consumer_too_slow"
  | "watch_cursor_out_of_range"
  | "workspace_outside_root";

/** How a failure with a reason may be retried (pkg/failure's retry classes). */
export type RetryClass = "permanent" | "transient" | "attempt_retry" | "attempt_terminal";

/** Every reason's usual status code (gRPC and Connect share the numbers) and retry class. */
export const REASONS: Readonly<Record<Reason, { code: number; retry: RetryClass }>> = {
  "attach_already_open": { code: 3, retry: "permanent" },
  "attach_open_required": { code: 3, retry: "permanent" },
  "backup_archive_corrupt": { code: 15, retry: "permanent" },
  "backup_archive_missing": { code: 15, retry: "permanent" },
  "backup_checkpoint_not_found": { code: 5, retry: "permanent" },
  "backup_digest_mismatch": { code: 9, retry: "permanent" },
  "backup_identity_mismatch": { code: 9, retry: "permanent" },
  "backup_manifest_mismatch": { code: 9, retry: "permanent" },
  "backup_metadata_disabled": { code: 9, retry: "permanent" },
  "backup_provider_pack_root_not_allowed": { code: 7, retry: "permanent" },
  "backup_staging_unsafe": { code: 9, retry: "permanent" },
  "backup_stamp_checkpoint_missing": { code: 9, retry: "permanent" },
  "backup_stamp_incomplete": { code: 9, retry: "permanent" },
  "backup_stamp_lease_mismatch": { code: 9, retry: "permanent" },
  "backup_stamp_manifest_mismatch": { code: 9, retry: "permanent" },
  "backup_stamp_signature_invalid": { code: 9, retry: "permanent" },
  "backup_store_failed": { code: 14, retry: "transient" },
  "backup_upload_header_missing": { code: 3, retry: "permanent" },
  "budget_exhausted": { code: 8, retry: "permanent" },
  "caller_not_authorized": { code: 7, retry: "permanent" },
  "caller_unauthenticated": { code: 16, retry: "permanent" },
  "canceled": { code: 1, retry: "permanent" },
  "checkpoint_deletion_unavailable": { code: 14, retry: "transient" },
  "command_id_reused": { code: 9, retry: "permanent" },
  "command_invalid": { code: 3, retry: "permanent" },
  "command_unsupported": { code: 12, retry: "permanent" },
  "controller_seq_not_contiguous": { code: 9, retry: "permanent" },
  "deadline_exceeded": { code: 4, retry: "transient" },
  "durable_handoff": { code: 9, retry: "permanent" },
  "execution_indeterminate": { code: 9, retry: "permanent" },
  "executor_draining": { code: 14, retry: "transient" },
  "gateway_capacity_exhausted": { code: 8, retry: "transient" },
  "gateway_capacity_invalid": { code: 3, retry: "permanent" },
  "gateway_grant_invalid": { code: 16, retry: "attempt_retry" },
  "gateway_id_conflict": { code: 6, retry: "permanent" },
  "gateway_lost_wait_exceeded": { code: 9, retry: "permanent" },
  "gateway_not_found": { code: 5, retry: "permanent" },
  "gateway_registration_unauthenticated": { code: 16, retry: "permanent" },
  "governed_wait_interaction_missing": { code: 13, retry: "permanent" },
  "idle_timeout": { code: 4, retry: "transient" },
  "interaction_already_answered": { code: 9, retry: "permanent" },
  "interaction_answer_invalid": { code: 3, retry: "permanent" },
  "interaction_not_found": { code: 5, retry: "permanent" },
  "internal": { code: 13, retry: "permanent" },
  "invalid_request": { code: 3, retry: "permanent" },
  "key_file_invalid": { code: 9, retry: "permanent" },
  "key_file_unsafe": { code: 9, retry: "permanent" },
  "native_cancellation_coordinator_missing": { code: 9, retry: "permanent" },
  "native_cancellation_pending_recovery": { code: 9, retry: "permanent" },
  "native_event_replay_conflict": { code: 9, retry: "attempt_terminal" },
  "native_execution_binding_changed": { code: 9, retry: "permanent" },
  "native_finalization_lease_busy": { code: 10, retry: "transient" },
  "native_provider_plan_too_large": { code: 9, retry: "permanent" },
  "native_result_pending_finalization": { code: 9, retry: "permanent" },
  "native_run_already_terminal": { code: 9, retry: "permanent" },
  "native_run_coordinator_missing": { code: 9, retry: "permanent" },
  "native_run_failed": { code: 9, retry: "permanent" },
  "native_run_terminal_invalid": { code: 9, retry: "permanent" },
  "native_runner_process_exited": { code: 14, retry: "attempt_retry" },
  "native_session_close_unrecoverable": { code: 9, retry: "permanent" },
  "native_session_interrupted": { code: 14, retry: "transient" },
  "native_session_lease_lost": { code: 10, retry: "transient" },
  "native_session_lease_ttl_invalid": { code: 3, retry: "permanent" },
  "native_session_not_active": { code: 14, retry: "transient" },
  "native_session_retry_exhausted": { code: 10, retry: "transient" },
  "native_session_supervisor_busy": { code: 10, retry: "transient" },
  "native_session_supervisor_checkpoint_mismatch": { code: 9, retry: "permanent" },
  "native_tool_authority_epoch_revoked": { code: 9, retry: "permanent" },
  "no_active_turn": { code: 9, retry: "permanent" },
  "outbox_soft_limit": { code: 8, retry: "transient" },
  "outbox_write_failed": { code: 13, retry: "permanent" },
  "p0_storage_exhausted": { code: 8, retry: "transient" },
  "page_token_filter_mismatch": { code: 3, retry: "permanent" },
  "page_token_invalid": { code: 3, retry: "permanent" },
  "peer_not_authorized": { code: 7, retry: "permanent" },
  "planning_mode_unsupported": { code: 14, retry: "attempt_retry" },
  "post_dispatch_db_failure": { code: 14, retry: "transient" },
  "provider_closed": { code: 14, retry: "transient" },
  "provider_config_invalid": { code: 3, retry: "permanent" },
  "provider_error": { code: 9, retry: "permanent" },
  "provider_frame_too_large": { code: 14, retry: "attempt_retry" },
  "provider_initialize_protocol_error": { code: 14, retry: "attempt_retry" },
  "provider_initialize_timeout": { code: 4, retry: "attempt_retry" },
  "provider_interrupt_failed": { code: 9, retry: "permanent" },
  "provider_not_admitted": { code: 3, retry: "permanent" },
  "provider_process_exited": { code: 14, retry: "attempt_retry" },
  "provider_process_lost": { code: 14, retry: "transient" },
  "provider_process_status_failed": { code: 14, retry: "attempt_retry" },
  "provider_protocol_error": { code: 9, retry: "permanent" },
  "provider_reconcile_failed": { code: 9, retry: "permanent" },
  "provider_request_timeout": { code: 4, retry: "attempt_retry" },
  "provider_resolved": { code: 9, retry: "permanent" },
  "provider_server_request_unsupported": { code: 9, retry: "permanent" },
  "provider_spawn_failed": { code: 14, retry: "transient" },
  "provider_start_failed": { code: 14, retry: "transient" },
  "provider_stdout_closed": { code: 14, retry: "attempt_retry" },
  "provider_steer_failed": { code: 9, retry: "permanent" },
  "provider_thread_already_open": { code: 9, retry: "permanent" },
  "provider_thread_mismatch": { code: 9, retry: "permanent" },
  "provider_thread_not_open": { code: 9, retry: "permanent" },
  "provider_thread_resume_failed": { code: 9, retry: "permanent" },
  "provider_thread_resume_mismatch": { code: 9, retry: "permanent" },
  "provider_thread_start_failed": { code: 9, retry: "permanent" },
  "provider_transport_failed": { code: 14, retry: "attempt_retry" },
  "provider_turn_active": { code: 9, retry: "permanent" },
  "provider_turn_failed": { code: 9, retry: "permanent" },
  "provider_turn_missing": { code: 9, retry: "permanent" },
  "provider_turn_start_failed": { code: 9, retry: "permanent" },
  "provider_unknown_turn": { code: 9, retry: "permanent" },
  "quota_queued_runs": { code: 8, retry: "transient" },
  "quota_warm_sessions": { code: 8, retry: "transient" },
  "run_holds_current_checkpoint": { code: 9, retry: "permanent" },
  "run_id_ambiguous": { code: 9, retry: "permanent" },
  "run_id_conflict": { code: 6, retry: "permanent" },
  "run_not_attached": { code: 9, retry: "permanent" },
  "run_not_ended": { code: 9, retry: "permanent" },
  "run_not_found": { code: 5, retry: "permanent" },
  "runner_artifact_unavailable": { code: 9, retry: "permanent" },
  "runner_attach_failed": { code: 14, retry: "transient" },
  "runner_attachment_superseded": { code: 10, retry: "transient" },
  "runner_attempt_fenced": { code: 9, retry: "permanent" },
  "runner_auth_failed": { code: 16, retry: "permanent" },
  "runner_backpressure": { code: 14, retry: "transient" },
  "runner_command_failed": { code: 14, retry: "transient" },
  "runner_connection_stale": { code: 10, retry: "transient" },
  "runner_continuity_break_archive_failed": { code: 13, retry: "permanent" },
  "runner_credential_expired": { code: 16, retry: "permanent" },
  "runner_direct_wss_failed": { code: 9, retry: "permanent" },
  "runner_disconnected": { code: 14, retry: "transient" },
  "runner_durable_identity_too_large": { code: 9, retry: "permanent" },
  "runner_environment_lease_mismatch": { code: 9, retry: "permanent" },
  "runner_exiting": { code: 14, retry: "transient" },
  "runner_gateway_draining": { code: 14, retry: "transient" },
  "runner_gateway_lost": { code: 14, retry: "transient" },
  "runner_gateway_unavailable": { code: 14, retry: "transient" },
  "runner_handshake_timeout": { code: 4, retry: "transient" },
  "runner_harness_backup_changed": { code: 10, retry: "transient" },
  "runner_harness_backup_lease_missing": { code: 3, retry: "permanent" },
  "runner_harness_backup_manifest_invalid": { code: 3, retry: "permanent" },
  "runner_harness_backup_not_canonical": { code: 9, retry: "permanent" },
  "runner_harness_backup_path_too_deep": { code: 9, retry: "permanent" },
  "runner_harness_backup_scope_invalid": { code: 3, retry: "permanent" },
  "runner_harness_backup_unavailable": { code: 14, retry: "transient" },
  "runner_harness_backup_unreadable": { code: 9, retry: "permanent" },
  "runner_harness_backup_unsafe_directory": { code: 9, retry: "permanent" },
  "runner_harness_backup_unsupported_entry": { code: 9, retry: "permanent" },
  "runner_harness_backup_unverified": { code: 9, retry: "permanent" },
  "runner_harness_identity_mismatch": { code: 9, retry: "permanent" },
  "runner_harness_provider_unsupported": { code: 3, retry: "permanent" },
  "runner_harness_state_mismatch": { code: 9, retry: "permanent" },
  "runner_ingress_bind_conflict": { code: 9, retry: "permanent" },
  "runner_ingress_unavailable": { code: 9, retry: "permanent" },
  "runner_local_connect_failed": { code: 13, retry: "permanent" },
  "runner_not_found": { code: 5, retry: "permanent" },
  "runner_protocol_error": { code: 13, retry: "permanent" },
  "runner_remote_artifact_contract_incompatible": { code: 9, retry: "permanent" },
  "runner_remote_checkpoint_archive_duplicate_entry": { code: 3, retry: "permanent" },
  "runner_remote_checkpoint_archive_expanded_too_large": { code: 3, retry: "permanent" },
  "runner_remote_checkpoint_archive_invalid": { code: 3, retry: "permanent" },
  "runner_remote_checkpoint_archive_too_large": { code: 3, retry: "permanent" },
  "runner_remote_checkpoint_archive_too_many_entries": { code: 3, retry: "permanent" },
  "runner_remote_checkpoint_archive_unsafe_entry": { code: 9, retry: "permanent" },
  "runner_remote_checkpoint_archive_unsafe_mode": { code: 3, retry: "permanent" },
  "runner_remote_checkpoint_archive_unsafe_path": { code: 3, retry: "permanent" },
  "runner_remote_checkpoint_exclusion_invalid": { code: 3, retry: "permanent" },
  "runner_remote_checkpoint_restore_failed": { code: 13, retry: "permanent" },
  "runner_remote_checkpoint_snapshot_failed": { code: 9, retry: "permanent" },
  "runner_remote_checkpoint_source_missing": { code: 5, retry: "permanent" },
  "runner_remote_checkpoint_target_unsafe": { code: 9, retry: "permanent" },
  "runner_remote_provider_artifact_incompatible": { code: 9, retry: "attempt_terminal" },
  "runner_remote_transport_capability_missing": { code: 9, retry: "permanent" },
  "runner_state_directory_unsafe": { code: 9, retry: "permanent" },
  "runner_state_identity_mismatch": { code: 3, retry: "permanent" },
  "runner_state_io_failed": { code: 13, retry: "permanent" },
  "runner_state_missing": { code: 5, retry: "permanent" },
  "runner_state_unreadable": { code: 13, retry: "permanent" },
  "runner_state_write_failed": { code: 13, retry: "permanent" },
  "runner_stopped": { code: 14, retry: "transient" },
  "runner_terminated": { code: 14, retry: "transient" },
  "runner_ticket_replayed": { code: 16, retry: "permanent" },
  "runner_transport_ineligible": { code: 3, retry: "permanent" },
  "runtime_request_no_longer_pending": { code: 9, retry: "permanent" },
  "runtime_request_not_pending": { code: 9, retry: "permanent" },
  "runtime_request_rejected": { code: 9, retry: "permanent" },
  "runtime_request_resolution_conflict": { code: 10, retry: "transient" },
  "runtime_request_resolution_invalid": { code: 3, retry: "permanent" },
  "runtime_request_resolution_unsupported": { code: 9, retry: "permanent" },
  "runtime_request_stale_turn": { code: 9, retry: "permanent" },
  "schema_outdated": { code: 9, retry: "permanent" },
  "secret_not_found": { code: 5, retry: "permanent" },
  "secret_unreadable": { code: 9, retry: "permanent" },
  "semantic_tool_timeout": { code: 4, retry: "transient" },
  "session_closed": { code: 9, retry: "permanent" },
  "session_not_found": { code: 5, retry: "permanent" },
  "session_scope_moving": { code: 14, retry: "transient" },
  "steering_rejected": { code: 9, retry: "transient" },
  "steering_stale_turn": { code: 9, retry: "transient" },
  "steering_temporarily_unavailable": { code: 14, retry: "transient" },
  "steering_timeout": { code: 4, retry: "transient" },
  "steering_unsupported": { code: 9, retry: "transient" },
  "tool_call_not_pending": { code: 9, retry: "permanent" },
  "tool_result_invalid": { code: 3, retry: "permanent" },
  "tool_result_rejected": { code: 9, retry: "permanent" },
  "transport_reconnect_deadline_exceeded": { code: 14, retry: "transient" },
  "turn_already_active": { code: 9, retry: "permanent" },
  "turn_ended": { code: 9, retry: "permanent" },
  "turn_mismatch": { code: 9, retry: "permanent" },
  "waiting_for_gateway": { code: 14, retry: "transient" },
  "warm_session_close_backup_failed": { code: 14, retry: "transient" },
  "warm_session_replaced": { code: 14, retry: "transient" },
  "watch_consumer_too_slow": { code: 14, retry: "transient" },
  "watch_cursor_out_of_range": { code: 11, retry: "permanent" },
  "workspace_outside_root": { code: 3, retry: "attempt_terminal" },
};
