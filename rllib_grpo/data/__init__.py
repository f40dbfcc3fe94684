"""Layer 2, data: what a rollout carries (rollout batches, multi-turn trajectories, prompt
images), micro-batch planning and the dynamic-sampling/validation recipes on rollouts.  No
Ray, no models.  The environments that produce rollouts are in `rllib_grpo.envs`."""
