"""Foreground/background labelling of noisy digits: the interactive-segmentation use case of
Movellan & Gabbur (2020, "On Line Belief Propagation", Eq. 31–38).

Every pixel of a noisy 8×8 scikit-learn digit is a token to label as foreground or background;
the last layer is a Gaussian mixture with one unit per pixel, so when an annotator gives the
correct label of a few pixels, the fix propagates to the others by EM (Eq. 35–38).

Modules: :mod:`~probtrans.segmentation.spec` (the spec file),
:mod:`~probtrans.segmentation.pixel_data` (noisy inputs and pixel labels),
:mod:`~probtrans.segmentation.segmenter` (the model and its training),
:mod:`~probtrans.segmentation.corrections` (the corrections curve).
"""

from probtrans.segmentation.segmenter import SegmentationModel, train_segmentation
from probtrans.segmentation.spec import SegmentationSpec, SegNetSpec, load_segmentation_spec

__all__ = [
    "SegNetSpec",
    "SegmentationModel",
    "SegmentationSpec",
    "load_segmentation_spec",
    "train_segmentation",
]
