//! Engagement: following an email's tracking link (a click) and fetching its open pixel (an
//! open). Both are public GETs, signed so that only links this system issued redirect or
//! count; each is appended to the email's stream before it is answered, so no acknowledged
//! click or open is lost.

pub(crate) mod decide;
pub mod http;
pub(crate) mod store;
