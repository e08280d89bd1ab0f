//! Public forms with double opt-in: `POST /forms/{formId}/submit` and
//! `GET /forms/{formId}/confirm/{token}` (no API key; the tenant is the form's).

pub mod decide;
pub mod http;
pub mod store;
