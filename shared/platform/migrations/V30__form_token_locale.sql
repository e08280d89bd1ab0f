-- The locale of the pages a double opt-in submitter sees (the form's thanks, then the page
-- of the confirmation link): chosen at the submission from the contact's locale, kept with
-- the token so the confirmation page speaks the same language. NULL for tokens issued
-- before pages had a language (their pages are in English).
ALTER TABLE form_tokens ADD COLUMN locale text;
