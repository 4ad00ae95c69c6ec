"""What to serve: autoBatch (the pods' batch-size estimates), InferLine's provisioning and tuner in
a pass."""
