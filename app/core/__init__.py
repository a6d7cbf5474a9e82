"""core: what every stage shares.

The experiment schema (schema) and its range checks (validation); a config resolved from its YAML files
(yamlfile) and ``--set`` (config); what ``model.name`` names (modelref); a researcher's own code (her model or
data function) imported and run so that its failures name her file and line (usercode); a run's directory with
the config saved in it (rundir); the two kinds of error a user sees and the exit statuses (errors); Keras 2
arranged before TensorFlow loads (compat); the readers of the files a run leaves behind (results); which
scaleout this is (version); where its profiles, job template and configs are, in a clone or a wheel (shipped);
files many processes share (files); stop signals passed on to other processes (signals); what Slurm tells a
process about its job (slurm); the tf engine's port range (ports); and what login-node code needs of newer
Pythons (iterables).

Imports nothing from the other packages of app, and neither TensorFlow nor Horovod at import time.
"""
