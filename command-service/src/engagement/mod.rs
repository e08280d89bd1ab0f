//! Engagement: following an email's tracking link (a click) and fetching its open pixel (an
//! open). Both are public GETs, signed so that only links this system issued redirect or
//! count; each is taken into `engagement_inbox` (a committed row, inserted with the hits of
//! concurrent requests in one statement) before it is answered, so no acknowledged click or
//! open is lost, and the projector's `engagement` worker appends it to the email's stream.

pub mod decide;
pub mod http;
pub mod store;
