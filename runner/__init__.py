"""Harbor runner: datasets, harness seams, sandboxes, engines, rollouts, batches, training."""
