"""Layer 2, data: text environments, prompt datasets, rollout batches, micro-batch
planning and the dynamic-sampling/validation recipes on rollouts.  No Ray, no models."""
