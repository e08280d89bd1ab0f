//! The roles a member can have in a space and the permissions each grants (the contract's
//! Authentication table): what the catalog stores and authorisation checks.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    Read,
    Write,
    Admin,
}

impl Permission {
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Admin => "admin",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Admin,
    NonPaidAdmin,
    Member,
}

impl Role {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "admin" => Some(Self::Admin),
            "non_paid_admin" => Some(Self::NonPaidAdmin),
            "member" => Some(Self::Member),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::NonPaidAdmin => "non_paid_admin",
            Self::Member => "member",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Admin => "Admin",
            Self::NonPaidAdmin => "Non-paid admin",
            Self::Member => "Member",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Self::Admin => "Full access: read, write and administration of the space",
            Self::NonPaidAdmin => "Read and administration of the space, without write access",
            Self::Member => "Read and write access to the space's data",
        }
    }

    pub fn permissions(self) -> &'static [Permission] {
        match self {
            Self::Admin => &[Permission::Read, Permission::Write, Permission::Admin],
            Self::NonPaidAdmin => &[Permission::Read, Permission::Admin],
            Self::Member => &[Permission::Read, Permission::Write],
        }
    }

    pub fn allows(self, permission: Permission) -> bool {
        self.permissions().contains(&permission)
    }
}
