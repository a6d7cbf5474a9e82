"""core: what every stage shares. The experiment schema (config), its YAML files (yamlfile) and a run's
directory with the config saved in it (rundir), the two kinds of error a user sees and the exit statuses
(errors), Keras 2 arranged before TensorFlow loads (compat), and the readers of the files a run leaves behind
(results).

Imports nothing from the other packages of app, and neither TensorFlow nor Horovod at import time.
"""
