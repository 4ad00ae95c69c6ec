"""What every process that runs a model needs: the model zoo, the pod's cpuset and CPU
topology, and pinning a process to its cores with matching thread settings."""
