"""The worker process: its slice of every minted interval, shared through its
group's builder (:mod:`shardsink.builder`) or written as its own batch."""
