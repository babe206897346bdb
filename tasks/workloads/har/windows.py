"""The windows both of har's sources write, in UCI HAR's format: 2.56 s at 50 Hz, nine inertial channels, six activities, thirty people.

UCI HAR (Anguita et al., ESANN 2013): 30 volunteers with a waist-worn smartphone, accelerometer and gyroscope at
50 Hz, windows of 128 samples of its nine Inertial Signals, six activities. The real source (hapt.py, processing.py)
and the synthetic one (synthetic.py) write windows of this shape, (N, STEPS, len(CHANNELS)) float32, and split the
people who made them into ROLES, no one's windows in two roles.
"""

SAMPLE_HZ, STEPS = 50, 128  # 2.56 s windows
CHANNELS = ("body_acc_x", "body_acc_y", "body_acc_z", "body_gyro_x", "body_gyro_y", "body_gyro_z",
            "total_acc_x", "total_acc_y", "total_acc_z")  # UCI HAR's Inertial Signals, in its order
ACTIVITIES = ("walking", "walking_upstairs", "walking_downstairs", "sitting", "standing", "lying")
CLASSES = len(ACTIVITIES)
SUBJECTS = 30
ROLES = ("train", "val", "test")  # the split's roles: no person's windows in two
