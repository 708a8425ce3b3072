//! gradient_ghost's exploding-layer measure: each layer's second moments
//! against the same tensors in its nearest layers, on a log scale.
