"""Everything written to disk: checkpoints, run directories, exported graphs, bundle manifests."""
