"""The trainer's Prometheus metrics (served on :9460 by rank 0)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

STEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
ROLLOUT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)


class TrainerMetrics:
    """All families live in ``registry`` (a fresh one per trainer; tests pass their own)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = self.registry = registry or CollectorRegistry()
        p = "warden_trainer_"
        self.steps = Counter(p + "steps", "PPO steps completed.", registry=reg)
        self.step_duration = Histogram(
            p + "step_duration_seconds", "Wall time of one PPO step.", buckets=STEP_BUCKETS, registry=reg
        )
        self.rollout_duration = Histogram(
            p + "rollout_duration_seconds",
            "Wall time of one rollout (generation).",
            buckets=ROLLOUT_BUCKETS,
            registry=reg,
        )
        # The last step's time split and each rank's own share (warden diagnose, alerts/rules/rollout-causes.yml).
        self.last_step_seconds = Gauge(p + "last_step_seconds", "Wall time of the last PPO step.", registry=reg)
        self.last_step_phase_seconds = Gauge(
            p + "last_step_phase_seconds",
            "Time of each phase of the last step: data (the batch), generation, reward (decoding and scoring), "
            "experience, update.",
            ["phase"],
            registry=reg,
        )
        self.rank_rollout_seconds = Gauge(
            p + "rank_rollout_seconds",
            "Each rank's own generation and scoring time in the last step (before waiting for the other ranks).",
            ["rank"],
            registry=reg,
        )
        self.tokens_per_second = Gauge(
            p + "generated_tokens_per_second", "Response tokens generated per second.", registry=reg
        )
        self.generated_tokens = Counter(p + "generated_tokens", "Response tokens generated.", registry=reg)
        self.reward_mean = Gauge(p + "reward_mean", "Mean reward of the last step.", registry=reg)
        self.reward_max = Gauge(p + "reward_max", "Max reward of the last step.", registry=reg)
        self.kl = Gauge(p + "kl", "Mean KL to the reference policy in the last step (nats/token).", registry=reg)
        self.kl_coef = Gauge(p + "kl_coef", "Current KL penalty coefficient.", registry=reg)
        self.policy_loss = Gauge(p + "policy_loss", "Policy loss of the last step.", registry=reg)
        self.value_loss = Gauge(p + "value_loss", "Value loss of the last step.", registry=reg)
        self.entropy = Gauge(p + "entropy", "Mean token entropy of the last step (nats).", registry=reg)
        self.clip_fraction = Gauge(p + "clip_fraction", "Fraction of tokens clipped by PPO.", registry=reg)
        self.grad_norm = Gauge(p + "grad_norm", "Actor gradient norm before clipping.", registry=reg)
        self.last_step = Gauge(p + "last_step", "Number of the last completed step.", registry=reg)
        self.last_step_time = Gauge(
            p + "last_step_timestamp_seconds", "Unix time the last step completed.", registry=reg
        )
        self.last_checkpoint_step = Gauge(
            p + "last_checkpoint_step", "Step of the newest complete checkpoint.", registry=reg
        )
        self.last_checkpoint_time = Gauge(
            p + "last_checkpoint_timestamp_seconds", "Unix time the newest checkpoint was completed.", registry=reg
        )
        self.checkpoint_failures = Counter(
            p + "checkpoint_write_failures", "Checkpoint writes that failed.", registry=reg
        )
        # Saves (trainer/saver.py) and the space they need (trainer/space.py).
        self.checkpoint_stall = Gauge(
            p + "checkpoint_stall_seconds",
            "Time the last save held training: the copy into host buffers (async) or the whole write (sync).",
            registry=reg,
        )
        self.checkpoint_write = Gauge(
            p + "checkpoint_write_seconds",
            "Time from the start of the last completed save to its bytes being durable and renamed into place.",
            registry=reg,
        )
        self.checkpoint_waits = Counter(
            p + "checkpoint_waits", "Saves that had to wait for the previous asynchronous save.", registry=reg
        )
        self.checkpoint_wait_seconds = Counter(
            p + "checkpoint_wait_seconds", "Time training waited for a previous asynchronous save.", registry=reg
        )
        self.checkpoint_in_flight = Gauge(
            p + "checkpoint_in_flight", "1 while an asynchronous save is being written.", registry=reg
        )
        self.checkpoint_host_buffer_bytes = Gauge(
            p + "checkpoint_host_buffer_bytes",
            "Host memory held for asynchronous saves (pinned on CUDA); 0 for synchronous saves.",
            registry=reg,
        )
        self.checkpoint_space_free = Gauge(
            p + "checkpoint_space_free_bytes",
            "Free bytes of the checkpoint root's filesystem (for an unprivileged writer), measured before each save.",
            registry=reg,
        )
        self.checkpoint_space_needed = Gauge(
            p + "checkpoint_space_needed_bytes",
            "Bytes the next checkpoint is expected to take (the last one's size, else the state's byte count).",
            registry=reg,
        )
        self.checkpoint_space_reclaimable = Gauge(
            p + "checkpoint_space_reclaimable_bytes",
            "Bytes of announced checkpoints the next save may remove first (checkpoint.on_no_space: "
            "prune_first; all but the newest), 0 in the other modes.",
            registry=reg,
        )
        self.checkpoint_skipped = Counter(
            p + "checkpoint_skipped",
            "Saves not made, by reason (no_space: would not fit even after pruning; write_failed: every retry failed).",
            ["reason"],
            registry=reg,
        )
        self.skipped_updates = Counter(
            p + "skipped_updates", "Optimizer steps skipped because a gradient was not finite.", registry=reg
        )
        self.kl_loss = Gauge(p + "kl_loss", "KL-to-reference loss term of the last step (nats/token).", registry=reg)
        self.response_length_mean = Gauge(
            p + "response_length_mean", "Mean response length of the last step (tokens).", registry=reg
        )
        self.response_length_max = Gauge(
            p + "response_length_max", "Longest response of the last step (tokens).", registry=reg
        )
        self.response_clip_ratio = Gauge(
            p + "response_clip_ratio",
            "Share of the last step's responses cut at max_new_tokens without a stop token.",
            registry=reg,
        )
        self.val_reward_mean = Gauge(p + "val_reward_mean", "Mean reward on the held-out set.", registry=reg)
        self.val_last_step = Gauge(p + "val_last_step", "Step of the last validation.", registry=reg)
        self.oom = Counter(p + "oom_events", "Out-of-memory errors caught.", ["phase"], registry=reg)
        self.info = Info(p + "run", "Run id and versions.", registry=reg)
        self.rollout_layout = Info(
            p + "rollout_layout",
            "Where the rollout engine runs: colocated or split (rollout.devices), engine, devices, TP size.",
            registry=reg,
        )
        # Elastic runs (docs/elastic.md): a smaller world after a node loss, and what the resume cost.
        self.world_size = Gauge(p + "world_size", "Data-parallel ranks of the running worker group.", registry=reg)
        self.restart_count = Gauge(
            p + "restart_count", "torchrun's restart count of the worker group (0 outside torchrun).", registry=reg
        )
        self.resume_lost_steps = Gauge(
            p + "resume_lost_steps",
            "Steps completed after the checkpoint the last resume loaded, trained again (0 without a resume).",
            registry=reg,
        )
        self.oom.labels("step")
        for reason in ("no_space", "write_failed"):
            self.checkpoint_skipped.labels(reason)
