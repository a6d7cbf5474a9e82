"""cluster: the login-node side of Slurm. Cluster profiles (jobs/clusters/*.yaml), the job script rendered
from them (launch, container, staging, requeue), and its submission with sbatch.

May import: app.core. Never imports TensorFlow or Horovod (directly or through another package): it runs on a
login node that has neither.
"""
