//! Nothing here: the package exists for its examples (`cargo run --example
//! quickstart`), which depend only on what an app of yours would.
