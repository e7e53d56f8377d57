//! tt-servingd.
