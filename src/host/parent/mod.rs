//! The parent role on the platform: the public calls (`dispatch`) and the driver that carries
//! out what the parent engine (`crate::parent::engine`) decides (`driver`).

pub(crate) mod dispatch;
pub(crate) mod driver;
pub(crate) mod sub_agent;
