"""A cluster's hosts: the agent that runs one host's processes
(:mod:`.agent`), and agents placed on the nodes of a Ray cluster
(:mod:`.ray`, with ``pip install 'shardsink[ray]'``)."""
