//! Placeholder; see issue [mock-server].
//! A faithful Volcano lock service mock.
