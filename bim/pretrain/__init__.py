"""The pretrain_bim bundle's code: the paper's losses, the cluster and projection heads, the pre-training
network and trainer, its handlers and the cluster-quality evaluation."""
