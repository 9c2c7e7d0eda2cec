"""The bottom layer: the problem and candidate formats, the typed evaluation record, the one
configuration, and the few facts (GPU architecture, kernel names, roofline arithmetic, the run
directory's file names) that the parent and the evaluation child share.

Standard library only: this is the one package of kernelwright that the evaluation child (and the
judge) may import besides their own, so nothing here may import torch or a layer above.
"""
