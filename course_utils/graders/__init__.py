"""One grader module per lesson; each registers with course_utils.grading.grader."""
