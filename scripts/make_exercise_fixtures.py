"""Recompute the exercises' stored cases (minilm_engine/course/teaching/fixtures/*.json).

    python scripts/make_exercise_fixtures.py

Run it after changing an exercise's case maker or the engine code that answers it;
tests/test_exercises.py fails until the stored fixtures match the package again.
"""

from minilm_engine.course.teaching.exercise_fixtures import write_fixtures

if __name__ == "__main__":
    for path in write_fixtures():
        print(f"wrote {path}")
