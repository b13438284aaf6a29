"""The paper's Tables 2 and 3 and the CPU demo, assembled from measured runs."""
