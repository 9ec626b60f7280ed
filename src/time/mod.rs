//! Time and tokens: the server's clock as the module reads it, and the fencing
//! token counter.

pub mod clock;
pub mod fencing;
