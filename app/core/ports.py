"""The tf engine's port range across nodes, shared by the job script and the workers.

The job script draws a port from it (app.cluster.launch) and the workers check it (app.engines.tfconfig).

20000-31999 stays below Linux's ephemeral ports (32768-60999 by default), so a port drawn there is seldom held
by an outgoing connection; a clash with another program fails at start-up in one line naming the address.
"""

TF_PORT_BASE, TF_PORT_SPAN = 20000, 12000
