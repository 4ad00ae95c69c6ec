"""Run one serving pod from a plan: TorchServe with pinned thin instances behind a dispatcher."""
