// This file is tether's one registry of stable failure reasons: every code
// string is written here once, with its gRPC code and retry class.

package failure

import "google.golang.org/grpc/codes"

// The stable reasons (SPEC.md). Each constant is an untyped string so that it
// can stand where the wire wants a string (a PRP result code, an event
// payload field, a runner lifecycle reason); APIs of this package take it as
// a Reason. Every constant has exactly one entry in registry below.
const (
	AttachAlreadyOpen  = "attach_already_open"
	AttachOpenRequired = "attach_open_required"
	// BackupArchiveCorrupt: the stored archive differs from its record.
	BackupArchiveCorrupt = "backup_archive_corrupt"
	// BackupArchiveMissing: the stored archive is gone from the blob store.
	BackupArchiveMissing = "backup_archive_missing"
	// BackupCheckpointNotFound: no such checkpoint.
	BackupCheckpointNotFound = "backup_checkpoint_not_found"
	BackupDigestMismatch     = "backup_digest_mismatch"
	BackupIdentityMismatch   = "backup_identity_mismatch"
	BackupManifestMismatch   = "backup_manifest_mismatch"
	// BackupMetadataDisabled: the verifier runs without a database.
	BackupMetadataDisabled = "backup_metadata_disabled"
	// BackupProviderPackRootNotAllowed: a provider pack outside the allowed
	// roots.
	BackupProviderPackRootNotAllowed = "backup_provider_pack_root_not_allowed"
	// BackupStagingUnsafe: the staging directory is not a private directory of
	// the verifier's user.
	BackupStagingUnsafe          = "backup_staging_unsafe"
	BackupStampCheckpointMissing = "backup_stamp_checkpoint_missing"
	BackupStampIncomplete        = "backup_stamp_incomplete"
	BackupStampLeaseMismatch     = "backup_stamp_lease_mismatch"
	BackupStampManifestMismatch  = "backup_stamp_manifest_mismatch"
	BackupStampSignatureInvalid  = "backup_stamp_signature_invalid"
	// BackupStoreFailed: the blob store or the database failed.
	BackupStoreFailed = "backup_store_failed"
	// BackupUploadHeaderMissing: an upload stream did not start with its header.
	BackupUploadHeaderMissing = "backup_upload_header_missing"
	// BudgetExhausted: the company's settled spend of the month (UTC) has
	// reached its monthly budget; new runs are refused until the budget is
	// raised or the month ends (SPEC Q2).
	BudgetExhausted = "budget_exhausted"
	// QuotaQueuedRuns: the company has max_queued_runs runs waiting to
	// start; a submission is admitted again once one starts (SPEC Q1).
	QuotaQueuedRuns = "quota_queued_runs"
	// QuotaWarmSessions: the run would open one more warm session than the
	// company's max_warm_sessions; admitted again once one closes (SPEC Q1).
	QuotaWarmSessions          = "quota_warm_sessions"
	Canceled                   = "canceled"
	CommandIDReused            = "command_id_reused"
	CommandInvalid             = "command_invalid"
	CommandUnsupported         = "command_unsupported"
	ControllerSeqNotContiguous = "controller_seq_not_contiguous"
	DeadlineExceeded           = "deadline_exceeded"
	DurableHandoff             = "durable_handoff"
	ExecutionIndeterminate     = "execution_indeterminate"
	ExecutorDraining           = "executor_draining"
	// GatewayCapacityExhausted: no active gateway whose labels satisfy the
	// run's placement has room; the run stays queued (SPEC F2).
	GatewayCapacityExhausted = "gateway_capacity_exhausted"
	// GatewayCapacityInvalid: a gateway registered with a capacity of 0 or
	// less (SPEC F1).
	GatewayCapacityInvalid = "gateway_capacity_invalid"
	// GatewayGrantInvalid: the stable code of every refused grant.
	GatewayGrantInvalid = "gateway_grant_invalid"
	// GatewayIDConflict: a gateway id held by a live gateway at another
	// address (SPEC F1).
	GatewayIDConflict = "gateway_id_conflict"
	// GatewayRegistrationUnauthenticated: a RegisterGateway without the
	// runnergw certificate identity and without the registration secret's
	// proof (SPEC T5).
	GatewayRegistrationUnauthenticated = "gateway_registration_unauthenticated"
	// GatewayNotFound: no registered gateway has this id (SPEC F4).
	GatewayNotFound = "gateway_not_found"
	// SessionScopeMoving: the run's session scope is being moved to another
	// gateway (a drain, SPEC F4); the run stays queued until it is placed.
	SessionScopeMoving = "session_scope_moving"
	// WaitingForGateway: the run's session scope is placed on a lost
	// gateway and cannot move (no verified checkpoint covers its newest
	// turn); the run stays queued, its attempt and turn kept, until the
	// gateway returns or the wait bound passes (SPEC F7).
	WaitingForGateway = "waiting_for_gateway"
	// GatewayLostWaitExceeded: the run's session scope waited for its lost
	// gateway longer than the executor's -gateway-lost-wait, with no
	// verified checkpoint to move with (SPEC F7).
	GatewayLostWaitExceeded        = "gateway_lost_wait_exceeded"
	GovernedWaitInteractionMissing = "governed_wait_interaction_missing"
	IdleTimeout                    = "idle_timeout"
	InteractionAlreadyAnswered     = "interaction_already_answered"
	// InteractionAnswerInvalid: an answer does not fit the interaction's
	// questions.
	InteractionAnswerInvalid = "interaction_answer_invalid"
	InteractionNotFound      = "interaction_not_found"
	Internal                 = "internal"
	// InvalidRequest: the stable code of a request that failed its protovalidate
	// rules.
	InvalidRequest = "invalid_request"
	// WorkspaceOutsideRoot: a run's workspace.cwd is not a clean absolute
	// path inside the workspace root of its company, or resolves (through a
	// symbolic link) outside it (SPEC T6).
	WorkspaceOutsideRoot = "workspace_outside_root"
	// KeyFileInvalid: the key file is too short, too long or unreadable.
	KeyFileInvalid = "key_file_invalid"
	// SchemaOutdated: the database lacks migrations this binary needs; a
	// service started with -migrate=false refuses to serve until
	// `<service> migrate` applied them (SPEC L3).
	SchemaOutdated = "schema_outdated"
	// KeyFileUnsafe: the key file is a symlink, not a regular file, owned by
	// another user or more open than 0600.
	KeyFileUnsafe                        = "key_file_unsafe"
	NativeCancellationCoordinatorMissing = "native_cancellation_coordinator_missing"
	NativeCancellationPendingRecovery    = "native_cancellation_pending_recovery"
	// NativeEventReplayConflict: the stable code of a replayed event whose bytes
	// differ.
	NativeEventReplayConflict     = "native_event_replay_conflict"
	NativeExecutionBindingChanged = "native_execution_binding_changed"
	NativeFinalizationLeaseBusy   = "native_finalization_lease_busy"
	// NativeProviderPlanTooLarge: the stable code of a plan (update or artifact
	// ref) larger than MaxRefBytes: it is refused and nothing of it is kept.
	NativeProviderPlanTooLarge      = "native_provider_plan_too_large"
	NativeResultPendingFinalization = "native_result_pending_finalization"
	NativeRunAlreadyTerminal        = "native_run_already_terminal"
	NativeRunCoordinatorMissing     = "native_run_coordinator_missing"
	NativeRunFailed                 = "native_run_failed"
	NativeRunTerminalInvalid        = "native_run_terminal_invalid"
	NativeRunnerProcessExited       = "native_runner_process_exited"
	// NativeSessionCloseUnrecoverable: the runner did not prove a durable
	// suspension (lifecycle suspended on disk, process gone) before the
	// checkpoint.
	NativeSessionCloseUnrecoverable = "native_session_close_unrecoverable"
	// NativeSessionInterrupted: marks an attempt that failed but will be
	// retried.
	NativeSessionInterrupted     = "native_session_interrupted"
	NativeSessionLeaseLost       = "native_session_lease_lost"
	NativeSessionLeaseTTLInvalid = "native_session_lease_ttl_invalid"
	NativeSessionNotActive       = "native_session_not_active"
	// NativeSessionRetryExhausted: marks a run whose last permitted attempt
	// failed.
	NativeSessionRetryExhausted = "native_session_retry_exhausted"
	// NativeSessionSupervisorBusy: another replica is suspending the scope, or a
	// run is attached to it.
	NativeSessionSupervisorBusy               = "native_session_supervisor_busy"
	NativeSessionSupervisorCheckpointMismatch = "native_session_supervisor_checkpoint_mismatch"
	NativeToolAuthorityEpochRevoked           = "native_tool_authority_epoch_revoked"
	NoActiveTurn                              = "no_active_turn"
	OutboxSoftLimit                           = "outbox_soft_limit"
	OutboxWriteFailed                         = "outbox_write_failed"
	P0StorageExhausted                        = "p0_storage_exhausted"
	PageTokenInvalid                          = "page_token_invalid"
	// PageTokenFilterMismatch: a List call's page_token was issued for a
	// call with other filters (AIP-158: a token is bound to its request).
	PageTokenFilterMismatch = "page_token_filter_mismatch"
	// CallerNotAuthorized: the authenticated principal holds no role that
	// allows the call for the company it names (SPEC T2).
	CallerNotAuthorized = "caller_not_authorized"
	// CallerUnauthenticated: a call that needs an identity came without one
	// (no verified client certificate naming a principal, no valid bearer
	// token; SPEC T1).
	CallerUnauthenticated = "caller_unauthenticated"
	// PeerNotAuthorized: the stable code of a call whose mTLS peer identity may
	// not call the service (SPEC S2).
	PeerNotAuthorized               = "peer_not_authorized"
	PlanningModeUnsupported         = "planning_mode_unsupported"
	PostDispatchDBFailure           = "post_dispatch_db_failure"
	ProviderClosed                  = "provider_closed"
	ProviderConfigInvalid           = "provider_config_invalid"
	ProviderError                   = "provider_error"
	ProviderFrameTooLarge           = "provider_frame_too_large"
	ProviderInitializeProtocolError = "provider_initialize_protocol_error"
	ProviderInitializeTimeout       = "provider_initialize_timeout"
	ProviderInterruptFailed         = "provider_interrupt_failed"
	// ProviderNotAdmitted: the stable code of every refusal.
	ProviderNotAdmitted              = "provider_not_admitted"
	ProviderProcessExited            = "provider_process_exited"
	ProviderProcessLost              = "provider_process_lost"
	ProviderProcessStatusFailed      = "provider_process_status_failed"
	ProviderProtocolError            = "provider_protocol_error"
	ProviderReconcileFailed          = "provider_reconcile_failed"
	ProviderRequestTimeout           = "provider_request_timeout"
	ProviderResolved                 = "provider_resolved"
	ProviderServerRequestUnsupported = "provider_server_request_unsupported"
	ProviderSpawnFailed              = "provider_spawn_failed"
	ProviderStartFailed              = "provider_start_failed"
	ProviderStdoutClosed             = "provider_stdout_closed"
	ProviderSteerFailed              = "provider_steer_failed"
	ProviderThreadAlreadyOpen        = "provider_thread_already_open"
	ProviderThreadMismatch           = "provider_thread_mismatch"
	ProviderThreadNotOpen            = "provider_thread_not_open"
	ProviderThreadResumeFailed       = "provider_thread_resume_failed"
	ProviderThreadResumeMismatch     = "provider_thread_resume_mismatch"
	ProviderThreadStartFailed        = "provider_thread_start_failed"
	ProviderTransportFailed          = "provider_transport_failed"
	ProviderTurnActive               = "provider_turn_active"
	ProviderTurnFailed               = "provider_turn_failed"
	ProviderTurnMissing              = "provider_turn_missing"
	ProviderTurnStartFailed          = "provider_turn_start_failed"
	ProviderUnknownTurn              = "provider_unknown_turn"
	RunIDConflict                    = "run_id_conflict"
	// RunIDAmbiguous: a caller that can read several companies (an
	// operator) named a run id more than one of them uses, without
	// company_id (SPEC T2).
	RunIDAmbiguous = "run_id_ambiguous"
	RunNotAttached = "run_not_attached"
	RunNotFound    = "run_not_found"
	// RunNotEnded: DeleteRun or PurgeCompany named a run that is queued or
	// running (SPEC L1); cancel it and wait for its end first.
	RunNotEnded = "run_not_ended"
	// RunHoldsCurrentCheckpoint: DeleteRun named the run its session's
	// current checkpoint was taken after (SPEC L1): the session's next run
	// restores from that checkpoint.
	RunHoldsCurrentCheckpoint = "run_holds_current_checkpoint"
	// CheckpointDeletionUnavailable: checkpoints had to be deleted and the
	// executor has no backup verifier to delete their archives with
	// (-backup-addr), or the verifier failed.
	CheckpointDeletionUnavailable      = "checkpoint_deletion_unavailable"
	RunnerArtifactUnavailable          = "runner_artifact_unavailable"
	RunnerAttachFailed                 = "runner_attach_failed"
	RunnerAttachmentSuperseded         = "runner_attachment_superseded"
	RunnerAttemptFenced                = "runner_attempt_fenced"
	RunnerAuthFailed                   = "runner_auth_failed"
	RunnerBackpressure                 = "runner_backpressure"
	RunnerCommandFailed                = "runner_command_failed"
	RunnerConnectionStale              = "runner_connection_stale"
	RunnerContinuityBreakArchiveFailed = "runner_continuity_break_archive_failed"
	RunnerCredentialExpired            = "runner_credential_expired"
	RunnerDirectWSSFailed              = "runner_direct_wss_failed"
	RunnerDisconnected                 = "runner_disconnected"
	RunnerDurableIdentityTooLarge      = "runner_durable_identity_too_large"
	// RunnerEnvironmentLeaseMismatch: the lease asked for is not the scope
	// runner's environment lease.
	RunnerEnvironmentLeaseMismatch = "runner_environment_lease_mismatch"
	// RunnerExiting: the Goodbye of a runnerd that exits (the gateway then
	// reports the runner exited).
	RunnerExiting            = "runner_exiting"
	RunnerGatewayDraining    = "runner_gateway_draining"
	RunnerGatewayUnavailable = "runner_gateway_unavailable"
	// RunnerGatewayLost: the run's session scope was moved off its lost
	// gateway while an attempt of the run was driven there (SPEC F3): the
	// attempt ends retryably and the retry restores the scope's checkpoint
	// on the new gateway under a new turn generation.
	RunnerGatewayLost = "runner_gateway_lost"
	// RunnerHandshakeTimeout: the runner did not complete Hello → Proof within
	// the gateway's handshake timeout (SPEC S5).
	RunnerHandshakeTimeout = "runner_handshake_timeout"
	// RunnerHarnessBackupChanged: an entry changed type or size while it was
	// read.
	RunnerHarnessBackupChanged      = "runner_harness_backup_changed"
	RunnerHarnessBackupLeaseMissing = "runner_harness_backup_lease_missing"
	// RunnerHarnessBackupManifestInvalid: a manifest that does not parse or is
	// not well formed.
	RunnerHarnessBackupManifestInvalid = "runner_harness_backup_manifest_invalid"
	// RunnerHarnessBackupNotCanonical: a BackupStream was fed entries out of
	// walk order.
	RunnerHarnessBackupNotCanonical = "runner_harness_backup_not_canonical"
	// RunnerHarnessBackupPathTooDeep: the tree is deeper than MaxDepth.
	RunnerHarnessBackupPathTooDeep  = "runner_harness_backup_path_too_deep"
	RunnerHarnessBackupScopeInvalid = "runner_harness_backup_scope_invalid"
	// RunnerHarnessBackupUnavailable: no backup verifier is configured or
	// reachable.
	RunnerHarnessBackupUnavailable = "runner_harness_backup_unavailable"
	// RunnerHarnessBackupUnreadable: the tree could not be read (permissions,
	// I/O).
	RunnerHarnessBackupUnreadable = "runner_harness_backup_unreadable"
	// RunnerHarnessBackupUnsafeDirectory: the root is a symlink or not a
	// directory.
	RunnerHarnessBackupUnsafeDirectory = "runner_harness_backup_unsafe_directory"
	// RunnerHarnessBackupUnsupportedEntry: the tree holds a symlink, device,
	// FIFO, socket or other non-regular entry (message: its relative path).
	RunnerHarnessBackupUnsupportedEntry = "runner_harness_backup_unsupported_entry"
	// RunnerHarnessBackupUnverified: the restore spec's stamp does not verify
	// for the lease (signature, lease, or the stored backup changed); nothing is
	// restored.
	RunnerHarnessBackupUnverified = "runner_harness_backup_unverified"
	// RunnerHarnessIdentityMismatch: the restored runner identity is not the
	// manifest's; nothing is restored.
	RunnerHarnessIdentityMismatch = "runner_harness_identity_mismatch"
	// RunnerHarnessProviderUnsupported: no persistence profile for this provider
	// kind.
	RunnerHarnessProviderUnsupported = "runner_harness_provider_unsupported"
	// RunnerHarnessStateMismatch: the harness state is not what a backup needs
	// (no provider session identity, a profile directory missing, a layout other
	// than the profile's).
	RunnerHarnessStateMismatch               = "runner_harness_state_mismatch"
	RunnerIngressBindConflict                = "runner_ingress_bind_conflict"
	RunnerIngressUnavailable                 = "runner_ingress_unavailable"
	RunnerLocalConnectFailed                 = "runner_local_connect_failed"
	RunnerNotFound                           = "runner_not_found"
	RunnerProtocolError                      = "runner_protocol_error"
	RunnerRemoteArtifactContractIncompatible = "runner_remote_artifact_contract_incompatible"
	// RunnerRemoteCheckpointArchiveDuplicateEntry: the same name twice in one
	// archive.
	RunnerRemoteCheckpointArchiveDuplicateEntry = "runner_remote_checkpoint_archive_duplicate_entry"
	// RunnerRemoteCheckpointArchiveExpandedTooLarge: the files add up to more
	// than MaxExpandedBytes.
	RunnerRemoteCheckpointArchiveExpandedTooLarge = "runner_remote_checkpoint_archive_expanded_too_large"
	// RunnerRemoteCheckpointArchiveInvalid: a malformed, truncated or empty
	// archive, or one whose layout is not what the caller asked for.
	RunnerRemoteCheckpointArchiveInvalid = "runner_remote_checkpoint_archive_invalid"
	// RunnerRemoteCheckpointArchiveTooLarge: the archive stream is larger than
	// MaxArchiveBytes.
	RunnerRemoteCheckpointArchiveTooLarge = "runner_remote_checkpoint_archive_too_large"
	// RunnerRemoteCheckpointArchiveTooManyEntries: more than MaxEntries entries.
	RunnerRemoteCheckpointArchiveTooManyEntries = "runner_remote_checkpoint_archive_too_many_entries"
	// RunnerRemoteCheckpointArchiveUnsafeEntry: a symlink, hard link, device,
	// FIFO or other non-regular entry (in an archive, or in a directory being
	// archived).
	RunnerRemoteCheckpointArchiveUnsafeEntry = "runner_remote_checkpoint_archive_unsafe_entry"
	// RunnerRemoteCheckpointArchiveUnsafeMode: a set-user-ID or set-group-ID
	// bit.
	RunnerRemoteCheckpointArchiveUnsafeMode = "runner_remote_checkpoint_archive_unsafe_mode"
	// RunnerRemoteCheckpointArchiveUnsafePath: an absolute name, a ".."
	// component, or a name that is not a normalised relative path.
	RunnerRemoteCheckpointArchiveUnsafePath = "runner_remote_checkpoint_archive_unsafe_path"
	// RunnerRemoteCheckpointExclusionInvalid: an exclusion is not a plain top-
	// level name.
	RunnerRemoteCheckpointExclusionInvalid = "runner_remote_checkpoint_exclusion_invalid"
	// RunnerRemoteCheckpointRestoreFailed: staging or swapping failed for an I/O
	// reason; the target is unchanged.
	RunnerRemoteCheckpointRestoreFailed = "runner_remote_checkpoint_restore_failed"
	// RunnerRemoteCheckpointSnapshotFailed: the snapshot could not be written
	// (I/O, or the live directory changed while it was archived).
	RunnerRemoteCheckpointSnapshotFailed = "runner_remote_checkpoint_snapshot_failed"
	// RunnerRemoteCheckpointSourceMissing: the directory to snapshot does not
	// exist.
	RunnerRemoteCheckpointSourceMissing = "runner_remote_checkpoint_source_missing"
	// RunnerRemoteCheckpointTargetUnsafe: the restore target is a symlink or not
	// a directory.
	RunnerRemoteCheckpointTargetUnsafe = "runner_remote_checkpoint_target_unsafe"
	// RunnerRemoteProviderArtifactIncompatible: prefixes every provider-pack
	// digest failure.
	RunnerRemoteProviderArtifactIncompatible = "runner_remote_provider_artifact_incompatible"
	// RunnerRemoteTransportCapabilityMissing: the runner build does not
	// support the transport mode; on the wire it is qualified by the mode
	// (Qualified).
	RunnerRemoteTransportCapabilityMissing = "runner_remote_transport_capability_missing"
	RunnerStateDirectoryUnsafe             = "runner_state_directory_unsafe"
	RunnerStateIdentityMismatch            = "runner_state_identity_mismatch"
	RunnerStateIOFailed                    = "runner_state_io_failed"
	// RunnerStateMissing: the scope has no runner state to suspend.
	RunnerStateMissing                  = "runner_state_missing"
	RunnerStateUnreadable               = "runner_state_unreadable"
	RunnerStateWriteFailed              = "runner_state_write_failed"
	RunnerStopped                       = "runner_stopped"
	RunnerTerminated                    = "runner_terminated"
	RunnerTicketReplayed                = "runner_ticket_replayed"
	RunnerTransportIneligible           = "runner_transport_ineligible"
	RuntimeRequestNoLongerPending       = "runtime_request_no_longer_pending"
	RuntimeRequestNotPending            = "runtime_request_not_pending"
	RuntimeRequestRejected              = "runtime_request_rejected"
	RuntimeRequestResolutionConflict    = "runtime_request_resolution_conflict"
	RuntimeRequestResolutionInvalid     = "runtime_request_resolution_invalid"
	RuntimeRequestResolutionUnsupported = "runtime_request_resolution_unsupported"
	RuntimeRequestStaleTurn             = "runtime_request_stale_turn"
	SemanticToolTimeout                 = "semantic_tool_timeout"
	SecretNotFound                      = "secret_not_found"
	SecretUnreadable                    = "secret_unreadable"
	SessionClosed                       = "session_closed"
	SessionNotFound                     = "session_not_found"
	SteeringRejected                    = "steering_rejected"
	SteeringStaleTurn                   = "steering_stale_turn"
	SteeringTemporarilyUnavailable      = "steering_temporarily_unavailable"
	SteeringTimeout                     = "steering_timeout"
	SteeringUnsupported                 = "steering_unsupported"
	ToolCallNotPending                  = "tool_call_not_pending"
	ToolResultInvalid                   = "tool_result_invalid"
	ToolResultRejected                  = "tool_result_rejected"
	TransportReconnectDeadlineExceeded  = "transport_reconnect_deadline_exceeded"
	TurnAlreadyActive                   = "turn_already_active"
	TurnEnded                           = "turn_ended"
	TurnMismatch                        = "turn_mismatch"
	WarmSessionReplaced                 = "warm_session_replaced"
	// WarmSessionCloseBackupFailed: closing a warm session for a
	// configuration change through the backup failed (the verifier
	// unreachable or refusing, the runner not suspending); the attempt ends
	// retryably and the session is not replaced on its local state.
	WarmSessionCloseBackupFailed = "warm_session_close_backup_failed"
	// WatchConsumerTooSlow: cuts off a watcher whose unsent events exceeded its
	// buffer; it resumes with WatchRun from the after_seq in the ErrorInfo
	// metadata (the last seq it was sent).
	WatchConsumerTooSlow  = "watch_consumer_too_slow"
	WatchCursorOutOfRange = "watch_cursor_out_of_range"
)

// registry gives each reason its default gRPC code and retry class.
var registry = map[Reason]Info{
	AttachAlreadyOpen:                             {codes.InvalidArgument, Permanent},
	AttachOpenRequired:                            {codes.InvalidArgument, Permanent},
	BackupArchiveCorrupt:                          {codes.DataLoss, Permanent},
	BackupArchiveMissing:                          {codes.DataLoss, Permanent},
	BackupCheckpointNotFound:                      {codes.NotFound, Permanent},
	BackupDigestMismatch:                          {codes.FailedPrecondition, Permanent},
	BackupIdentityMismatch:                        {codes.FailedPrecondition, Permanent},
	BackupManifestMismatch:                        {codes.FailedPrecondition, Permanent},
	BackupMetadataDisabled:                        {codes.FailedPrecondition, Permanent},
	BackupProviderPackRootNotAllowed:              {codes.PermissionDenied, Permanent},
	BackupStagingUnsafe:                           {codes.FailedPrecondition, Permanent},
	BackupStampCheckpointMissing:                  {codes.FailedPrecondition, Permanent},
	BackupStampIncomplete:                         {codes.FailedPrecondition, Permanent},
	BackupStampLeaseMismatch:                      {codes.FailedPrecondition, Permanent},
	BackupStampManifestMismatch:                   {codes.FailedPrecondition, Permanent},
	BackupStampSignatureInvalid:                   {codes.FailedPrecondition, Permanent},
	BackupStoreFailed:                             {codes.Unavailable, Transient},
	BackupUploadHeaderMissing:                     {codes.InvalidArgument, Permanent},
	Canceled:                                      {codes.Canceled, Permanent},
	CommandIDReused:                               {codes.FailedPrecondition, Permanent},
	CommandInvalid:                                {codes.InvalidArgument, Permanent},
	CommandUnsupported:                            {codes.Unimplemented, Permanent},
	ControllerSeqNotContiguous:                    {codes.FailedPrecondition, Permanent},
	DeadlineExceeded:                              {codes.DeadlineExceeded, Transient},
	DurableHandoff:                                {codes.FailedPrecondition, Permanent},
	ExecutionIndeterminate:                        {codes.FailedPrecondition, Permanent},
	ExecutorDraining:                              {codes.Unavailable, Transient},
	GatewayCapacityExhausted:                      {codes.ResourceExhausted, Transient},
	GatewayCapacityInvalid:                        {codes.InvalidArgument, Permanent},
	GatewayGrantInvalid:                           {codes.Unauthenticated, AttemptRetry},
	GatewayIDConflict:                             {codes.AlreadyExists, Permanent},
	GatewayRegistrationUnauthenticated:            {codes.Unauthenticated, Permanent},
	GatewayNotFound:                               {codes.NotFound, Permanent},
	SessionScopeMoving:                            {codes.Unavailable, Transient},
	WaitingForGateway:                             {codes.Unavailable, Transient},
	GatewayLostWaitExceeded:                       {codes.FailedPrecondition, Permanent},
	GovernedWaitInteractionMissing:                {codes.Internal, Permanent},
	IdleTimeout:                                   {codes.DeadlineExceeded, Transient},
	InteractionAlreadyAnswered:                    {codes.FailedPrecondition, Permanent},
	InteractionAnswerInvalid:                      {codes.InvalidArgument, Permanent},
	InteractionNotFound:                           {codes.NotFound, Permanent},
	Internal:                                      {codes.Internal, Permanent},
	InvalidRequest:                                {codes.InvalidArgument, Permanent},
	WorkspaceOutsideRoot:                          {codes.InvalidArgument, AttemptTerminal},
	KeyFileInvalid:                                {codes.FailedPrecondition, Permanent},
	SchemaOutdated:                                {codes.FailedPrecondition, Permanent},
	KeyFileUnsafe:                                 {codes.FailedPrecondition, Permanent},
	NativeCancellationCoordinatorMissing:          {codes.FailedPrecondition, Permanent},
	NativeCancellationPendingRecovery:             {codes.FailedPrecondition, Permanent},
	NativeEventReplayConflict:                     {codes.FailedPrecondition, AttemptTerminal},
	NativeExecutionBindingChanged:                 {codes.FailedPrecondition, Permanent},
	NativeFinalizationLeaseBusy:                   {codes.Aborted, Transient},
	NativeProviderPlanTooLarge:                    {codes.FailedPrecondition, Permanent},
	NativeResultPendingFinalization:               {codes.FailedPrecondition, Permanent},
	NativeRunAlreadyTerminal:                      {codes.FailedPrecondition, Permanent},
	NativeRunCoordinatorMissing:                   {codes.FailedPrecondition, Permanent},
	NativeRunFailed:                               {codes.FailedPrecondition, Permanent},
	NativeRunTerminalInvalid:                      {codes.FailedPrecondition, Permanent},
	NativeRunnerProcessExited:                     {codes.Unavailable, AttemptRetry},
	NativeSessionCloseUnrecoverable:               {codes.FailedPrecondition, Permanent},
	NativeSessionInterrupted:                      {codes.Unavailable, Transient},
	NativeSessionLeaseLost:                        {codes.Aborted, Transient},
	NativeSessionLeaseTTLInvalid:                  {codes.InvalidArgument, Permanent},
	NativeSessionNotActive:                        {codes.Unavailable, Transient},
	NativeSessionRetryExhausted:                   {codes.Aborted, Transient},
	NativeSessionSupervisorBusy:                   {codes.Aborted, Transient},
	NativeSessionSupervisorCheckpointMismatch:     {codes.FailedPrecondition, Permanent},
	NativeToolAuthorityEpochRevoked:               {codes.FailedPrecondition, Permanent},
	NoActiveTurn:                                  {codes.FailedPrecondition, Permanent},
	OutboxSoftLimit:                               {codes.ResourceExhausted, Transient},
	OutboxWriteFailed:                             {codes.Internal, Permanent},
	P0StorageExhausted:                            {codes.ResourceExhausted, Transient},
	BudgetExhausted:                               {codes.ResourceExhausted, Permanent},
	QuotaQueuedRuns:                               {codes.ResourceExhausted, Transient},
	QuotaWarmSessions:                             {codes.ResourceExhausted, Transient},
	PageTokenInvalid:                              {codes.InvalidArgument, Permanent},
	PageTokenFilterMismatch:                       {codes.InvalidArgument, Permanent},
	PeerNotAuthorized:                             {codes.PermissionDenied, Permanent},
	CallerNotAuthorized:                           {codes.PermissionDenied, Permanent},
	CallerUnauthenticated:                         {codes.Unauthenticated, Permanent},
	PlanningModeUnsupported:                       {codes.Unavailable, AttemptRetry},
	PostDispatchDBFailure:                         {codes.Unavailable, Transient},
	ProviderClosed:                                {codes.Unavailable, Transient},
	ProviderConfigInvalid:                         {codes.InvalidArgument, Permanent},
	ProviderError:                                 {codes.FailedPrecondition, Permanent},
	ProviderFrameTooLarge:                         {codes.Unavailable, AttemptRetry},
	ProviderInitializeProtocolError:               {codes.Unavailable, AttemptRetry},
	ProviderInitializeTimeout:                     {codes.DeadlineExceeded, AttemptRetry},
	ProviderInterruptFailed:                       {codes.FailedPrecondition, Permanent},
	ProviderNotAdmitted:                           {codes.InvalidArgument, Permanent},
	ProviderProcessExited:                         {codes.Unavailable, AttemptRetry},
	ProviderProcessLost:                           {codes.Unavailable, Transient},
	ProviderProcessStatusFailed:                   {codes.Unavailable, AttemptRetry},
	ProviderProtocolError:                         {codes.FailedPrecondition, Permanent},
	ProviderReconcileFailed:                       {codes.FailedPrecondition, Permanent},
	ProviderRequestTimeout:                        {codes.DeadlineExceeded, AttemptRetry},
	ProviderResolved:                              {codes.FailedPrecondition, Permanent},
	ProviderServerRequestUnsupported:              {codes.FailedPrecondition, Permanent},
	ProviderSpawnFailed:                           {codes.Unavailable, Transient},
	ProviderStartFailed:                           {codes.Unavailable, Transient},
	ProviderStdoutClosed:                          {codes.Unavailable, AttemptRetry},
	ProviderSteerFailed:                           {codes.FailedPrecondition, Permanent},
	ProviderThreadAlreadyOpen:                     {codes.FailedPrecondition, Permanent},
	ProviderThreadMismatch:                        {codes.FailedPrecondition, Permanent},
	ProviderThreadNotOpen:                         {codes.FailedPrecondition, Permanent},
	ProviderThreadResumeFailed:                    {codes.FailedPrecondition, Permanent},
	ProviderThreadResumeMismatch:                  {codes.FailedPrecondition, Permanent},
	ProviderThreadStartFailed:                     {codes.FailedPrecondition, Permanent},
	ProviderTransportFailed:                       {codes.Unavailable, AttemptRetry},
	ProviderTurnActive:                            {codes.FailedPrecondition, Permanent},
	ProviderTurnFailed:                            {codes.FailedPrecondition, Permanent},
	ProviderTurnMissing:                           {codes.FailedPrecondition, Permanent},
	ProviderTurnStartFailed:                       {codes.FailedPrecondition, Permanent},
	ProviderUnknownTurn:                           {codes.FailedPrecondition, Permanent},
	RunIDConflict:                                 {codes.AlreadyExists, Permanent},
	RunIDAmbiguous:                                {codes.FailedPrecondition, Permanent},
	RunNotAttached:                                {codes.FailedPrecondition, Permanent},
	RunNotFound:                                   {codes.NotFound, Permanent},
	RunNotEnded:                                   {codes.FailedPrecondition, Permanent},
	RunHoldsCurrentCheckpoint:                     {codes.FailedPrecondition, Permanent},
	CheckpointDeletionUnavailable:                 {codes.Unavailable, Transient},
	RunnerArtifactUnavailable:                     {codes.FailedPrecondition, Permanent},
	RunnerAttachFailed:                            {codes.Unavailable, Transient},
	RunnerAttachmentSuperseded:                    {codes.Aborted, Transient},
	RunnerAttemptFenced:                           {codes.FailedPrecondition, Permanent},
	RunnerAuthFailed:                              {codes.Unauthenticated, Permanent},
	RunnerBackpressure:                            {codes.Unavailable, Transient},
	RunnerCommandFailed:                           {codes.Unavailable, Transient},
	RunnerConnectionStale:                         {codes.Aborted, Transient},
	RunnerContinuityBreakArchiveFailed:            {codes.Internal, Permanent},
	RunnerCredentialExpired:                       {codes.Unauthenticated, Permanent},
	RunnerDirectWSSFailed:                         {codes.FailedPrecondition, Permanent},
	RunnerDisconnected:                            {codes.Unavailable, Transient},
	RunnerDurableIdentityTooLarge:                 {codes.FailedPrecondition, Permanent},
	RunnerEnvironmentLeaseMismatch:                {codes.FailedPrecondition, Permanent},
	RunnerExiting:                                 {codes.Unavailable, Transient},
	RunnerGatewayDraining:                         {codes.Unavailable, Transient},
	RunnerGatewayUnavailable:                      {codes.Unavailable, Transient},
	RunnerGatewayLost:                             {codes.Unavailable, Transient},
	RunnerHandshakeTimeout:                        {codes.DeadlineExceeded, Transient},
	RunnerHarnessBackupChanged:                    {codes.Aborted, Transient},
	RunnerHarnessBackupLeaseMissing:               {codes.InvalidArgument, Permanent},
	RunnerHarnessBackupManifestInvalid:            {codes.InvalidArgument, Permanent},
	RunnerHarnessBackupNotCanonical:               {codes.FailedPrecondition, Permanent},
	RunnerHarnessBackupPathTooDeep:                {codes.FailedPrecondition, Permanent},
	RunnerHarnessBackupScopeInvalid:               {codes.InvalidArgument, Permanent},
	RunnerHarnessBackupUnavailable:                {codes.Unavailable, Transient},
	RunnerHarnessBackupUnreadable:                 {codes.FailedPrecondition, Permanent},
	RunnerHarnessBackupUnsafeDirectory:            {codes.FailedPrecondition, Permanent},
	RunnerHarnessBackupUnsupportedEntry:           {codes.FailedPrecondition, Permanent},
	RunnerHarnessBackupUnverified:                 {codes.FailedPrecondition, Permanent},
	RunnerHarnessIdentityMismatch:                 {codes.FailedPrecondition, Permanent},
	RunnerHarnessProviderUnsupported:              {codes.InvalidArgument, Permanent},
	RunnerHarnessStateMismatch:                    {codes.FailedPrecondition, Permanent},
	RunnerIngressBindConflict:                     {codes.FailedPrecondition, Permanent},
	RunnerIngressUnavailable:                      {codes.FailedPrecondition, Permanent},
	RunnerLocalConnectFailed:                      {codes.Internal, Permanent},
	RunnerNotFound:                                {codes.NotFound, Permanent},
	RunnerProtocolError:                           {codes.Internal, Permanent},
	RunnerRemoteArtifactContractIncompatible:      {codes.FailedPrecondition, Permanent},
	RunnerRemoteCheckpointArchiveDuplicateEntry:   {codes.InvalidArgument, Permanent},
	RunnerRemoteCheckpointArchiveExpandedTooLarge: {codes.InvalidArgument, Permanent},
	RunnerRemoteCheckpointArchiveInvalid:          {codes.InvalidArgument, Permanent},
	RunnerRemoteCheckpointArchiveTooLarge:         {codes.InvalidArgument, Permanent},
	RunnerRemoteCheckpointArchiveTooManyEntries:   {codes.InvalidArgument, Permanent},
	RunnerRemoteCheckpointArchiveUnsafeEntry:      {codes.FailedPrecondition, Permanent},
	RunnerRemoteCheckpointArchiveUnsafeMode:       {codes.InvalidArgument, Permanent},
	RunnerRemoteCheckpointArchiveUnsafePath:       {codes.InvalidArgument, Permanent},
	RunnerRemoteCheckpointExclusionInvalid:        {codes.InvalidArgument, Permanent},
	RunnerRemoteCheckpointRestoreFailed:           {codes.Internal, Permanent},
	RunnerRemoteCheckpointSnapshotFailed:          {codes.FailedPrecondition, Permanent},
	RunnerRemoteCheckpointSourceMissing:           {codes.NotFound, Permanent},
	RunnerRemoteCheckpointTargetUnsafe:            {codes.FailedPrecondition, Permanent},
	RunnerRemoteTransportCapabilityMissing:        {codes.FailedPrecondition, Permanent},
	RunnerRemoteProviderArtifactIncompatible:      {codes.FailedPrecondition, AttemptTerminal},
	RunnerStateDirectoryUnsafe:                    {codes.FailedPrecondition, Permanent},
	RunnerStateIdentityMismatch:                   {codes.InvalidArgument, Permanent},
	RunnerStateIOFailed:                           {codes.Internal, Permanent},
	RunnerStateMissing:                            {codes.NotFound, Permanent},
	RunnerStateUnreadable:                         {codes.Internal, Permanent},
	RunnerStateWriteFailed:                        {codes.Internal, Permanent},
	RunnerStopped:                                 {codes.Unavailable, Transient},
	RunnerTerminated:                              {codes.Unavailable, Transient},
	RunnerTicketReplayed:                          {codes.Unauthenticated, Permanent},
	RunnerTransportIneligible:                     {codes.InvalidArgument, Permanent},
	RuntimeRequestNoLongerPending:                 {codes.FailedPrecondition, Permanent},
	RuntimeRequestNotPending:                      {codes.FailedPrecondition, Permanent},
	RuntimeRequestRejected:                        {codes.FailedPrecondition, Permanent},
	RuntimeRequestResolutionConflict:              {codes.Aborted, Transient},
	RuntimeRequestResolutionInvalid:               {codes.InvalidArgument, Permanent},
	RuntimeRequestResolutionUnsupported:           {codes.FailedPrecondition, Permanent},
	RuntimeRequestStaleTurn:                       {codes.FailedPrecondition, Permanent},
	SemanticToolTimeout:                           {codes.DeadlineExceeded, Transient},
	SecretNotFound:                                {codes.NotFound, Permanent},
	SecretUnreadable:                              {codes.FailedPrecondition, Permanent},
	SessionClosed:                                 {codes.FailedPrecondition, Permanent},
	SessionNotFound:                               {codes.NotFound, Permanent},
	SteeringRejected:                              {codes.FailedPrecondition, Transient},
	SteeringStaleTurn:                             {codes.FailedPrecondition, Transient},
	SteeringTemporarilyUnavailable:                {codes.Unavailable, Transient},
	SteeringTimeout:                               {codes.DeadlineExceeded, Transient},
	SteeringUnsupported:                           {codes.FailedPrecondition, Transient},
	ToolCallNotPending:                            {codes.FailedPrecondition, Permanent},
	ToolResultInvalid:                             {codes.InvalidArgument, Permanent},
	ToolResultRejected:                            {codes.FailedPrecondition, Permanent},
	TransportReconnectDeadlineExceeded:            {codes.Unavailable, Transient},
	TurnAlreadyActive:                             {codes.FailedPrecondition, Permanent},
	TurnEnded:                                     {codes.FailedPrecondition, Permanent},
	TurnMismatch:                                  {codes.FailedPrecondition, Permanent},
	WarmSessionReplaced:                           {codes.Unavailable, Transient},
	WarmSessionCloseBackupFailed:                  {codes.Unavailable, Transient},
	WatchConsumerTooSlow:                          {codes.Unavailable, Transient},
	WatchCursorOutOfRange:                         {codes.OutOfRange, Permanent},
}
